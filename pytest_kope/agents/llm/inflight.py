"""The model call in flight: its time limit, its progress, and how it is ended from another thread.

A call that runs out of time, or that Ctrl-C cancels, must end now, and on the server too: llama.cpp
(and any server with few slots) goes on generating for a client that merely stopped reading, so a
retry would queue behind the request it abandoned. Closing our end of a socket that another thread is
reading does not reach the server (the kernel keeps the connection while that thread sits in recv), so
the call's socket is shut down (`shutdown(SHUT_RDWR)`): the reading thread wakes at once and the
server's next write fails, which is how it learns the client has gone.

The socket comes from httpcore's `trace` request extension as the connection is made (`trace`, set on
every request by `http_client`'s hook); the client keeps no idle connection, so each request makes one.
A watchdog thread per call ends it at its deadline and reports progress while it runs.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# How a call ended early -> (CallError kind, what the agent says of it).
ENDINGS = {
    "time-out": ("retry", "no complete reply within {s:g} s from {api}: the request was cancelled"),
    "budget": ("budget", "the time budget (--kope-time-budget) ended the call to {api} after {s:g} s"),
    "cancelled": ("cancelled", "the call to {api} was cancelled by {why} after {s:g} s"),
}
TICK_S = 15.0  # a progress report this often during a long call


class InFlight:
    """One provider's calls, one at a time: `begin` a call with its limit, `finish` it; `cancel` (from
    any thread, a signal handler included) ends the call in flight and every later one at once."""

    def __init__(self) -> None:
        self.cancelled = ""  # why the agent was cancelled ("SIGINT"); sticky: no later call starts
        self.ended = ""  # how the call in flight ended early: "" | time-out | budget | cancelled
        self.seconds = 0.0  # its limit
        self.started = 0.0
        self.tokens = 0  # streamed tokens received so far
        self.first: float | None = None  # seconds to the first of them
        self.on_tick: Callable[[InFlight], None] | None = None  # a long call's progress (the agent's line)
        self._stream: Any = None  # httpcore's network stream of the call's connection
        self._done = threading.Event()
        self._woken = threading.Event()  # set by cancel: a back-off sleep ends early

    # -- one call ----------------------------------------------------------------------------------
    def begin(self, seconds: float, why: str) -> None:
        """A call starts: it ends as `why` (time-out or budget) after `seconds`."""
        self.ended, self.seconds, self.tokens, self.first = "", seconds, 0, None
        self.started, self._stream = time.monotonic(), None
        self._done = done = threading.Event()
        if self.cancelled:
            self.ended = "cancelled"
            return
        threading.Thread(target=self._watch, args=(done, seconds, why), daemon=True).start()

    def finish(self) -> None:
        self._done.set()
        self._stream = None

    def got(self, tokens: int = 1) -> None:
        """Streamed tokens arrived."""
        if self.first is None:
            self.first = time.monotonic() - self.started
        self.tokens += tokens

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def ending(self, api: str) -> tuple[str, str, str]:
        """How the call ended early, as a CallError's (kind, what, short): wire.ended makes it."""
        kind, said = ENDINGS[self.ended]
        what = said.format(s=round(self.elapsed(), 1), api=api, why=self.cancelled or "a signal")
        if self.ended == "time-out":
            what += f" (limit {self.seconds:g} s, --kope-llm-timeout) and its connection closed"
        return kind, what, self.ended

    # -- ending it from elsewhere -----------------------------------------------------------------
    def cancel(self, why: str) -> None:
        """Ctrl-C: the call in flight ends now, and no other starts. Safe in a signal handler: it
        takes no lock (the interrupted frame may hold one)."""
        self.cancelled = self.cancelled or why
        self._woken.set()
        self.end("cancelled")

    def end(self, how: str) -> None:
        """End the call in flight (if any) as `how`: its socket shut down, so the reader wakes and
        the server's next write fails."""
        if self._done.is_set() and not self._stream:
            return
        self.ended = self.ended or how
        _shut(self._stream)

    def sleep(self, seconds: float) -> None:
        """A back-off that Ctrl-C cuts short."""
        self._woken.wait(max(0.0, seconds))

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: the connection's stream as it is made (after TLS, the TLS one)."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self._stream = info.get("return_value")
            if self.ended:  # ended while it connected: this connection is shut at once
                _shut(self._stream)

    def _watch(self, done: threading.Event, seconds: float, why: str) -> None:
        deadline = time.monotonic() + seconds
        while not done.wait(max(0.0, min(TICK_S, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                if self._done is done:  # still this call's, not one begun since it finished
                    self.end(why)
                return
            if self.on_tick is not None:
                try:
                    self.on_tick(self)
                except Exception:  # noqa: BLE001 - a progress line must not end the call
                    pass


def _shut(stream: Any) -> None:
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def http_client(sdk: Any, flight: InFlight, timeout: float) -> Any:
    """The SDK's own httpx client, with `flight.trace` on every request and no idle connections
    kept (each call's connection is its own, so the socket `trace` learns is the one to shut). The
    SDKs build on different httpx packages (openai on httpx, anthropic on httpx2): the client's own
    package makes its settings."""
    base = next(c for c in sdk.DefaultHttpxClient.__mro__ if c.__name__ == "Client")
    httpx = sys.modules[base.__module__.split(".")[0]]

    def hook(request: Any) -> None:
        request.extensions["trace"] = flight.trace

    return sdk.DefaultHttpxClient(
        timeout=httpx.Timeout(timeout, connect=min(timeout, 30.0)),
        limits=httpx.Limits(max_keepalive_connections=0),
        event_hooks={"request": [hook]},
    )
