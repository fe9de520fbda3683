"""A scripted Anthropic Messages-API server on 127.0.0.1, for testing the `claude` agent over real HTTP.

Each POST to ``/v1/messages`` takes the next entry of a queue and answers with it::

    server.push(
        reply(tool_call("query_experience", {"question": "what helped softmax?"})),
        status(429, headers={"retry-after": "0"}),
        reply(text("done")),
        garbage(),
        empty(),
    )

Every request is recorded (path, headers, parsed JSON body) in ``server.requests``. When the queue is
empty the server answers 400 (not retried by clients) and counts it in ``server.exhausted``.

The fixture is called ``messages_server``; its function is ``messages_server_fixture`` (so a test's
argument does not shadow the import): ``from messages_server import messages_server_fixture`` in a test
module or conftest.py, or ``pytest_plugins = ["messages_server"]`` in the root conftest.py.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import pytest

_ids = itertools.count(1)


def text(s: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": s}


def tool_call(name: str, input: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    """A tool_use content block, as the model sends it."""
    return {"type": "tool_use", "id": id or f"toolu_{next(_ids):04d}", "name": name, "input": input}


def usage(input: int = 100, output: int = 50, cache_read: int = 0, cache_creation: int = 0) -> dict[str, int]:
    return {
        "input_tokens": input,
        "output_tokens": output,
        "cache_read_input_tokens": cache_read,
        "cache_creation_input_tokens": cache_creation,
    }


def reply(
    *blocks: dict[str, Any], stop_reason: str | None = None, tokens: dict[str, int] | None = None
) -> Entry:
    """A 200 answer carrying one assistant message with these content blocks."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    message = {
        "type": "message",
        "role": "assistant",
        "content": list(blocks),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": tokens or usage(),
    }
    return Entry("message", body=message)


def empty(tokens: dict[str, int] | None = None) -> Entry:
    """A 200 answer whose message has an empty content list."""
    return reply(stop_reason="end_turn", tokens=tokens)


def status(code: int, body: Any = None, headers: dict[str, str] | None = None) -> Entry:
    """An HTTP error answer (429, 500, 529, ...) with an Anthropic-shaped error body by default."""
    if body is None:
        kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(code, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": f"scripted {code}"}}
    return Entry("status", code=code, body=body, headers=headers or {})


def garbage(raw: str = '{"type": "message", "content": [ not json') -> Entry:
    """A 200 answer whose body claims to be JSON and is not."""
    return Entry("raw", raw=raw)


def slow(seconds: float, entry: Entry) -> Entry:
    """The entry, answered only after `seconds` (for client time-outs)."""
    entry.delay = seconds
    return entry


@dataclass
class Entry:
    kind: str  # message | status | raw | stream (server-sent events, `chunks` one by one)
    body: Any = None
    code: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw: str = ""
    delay: float = 0.0  # before the answer (a stream: after its headers, before its first chunk)
    chunks: list[str] = field(default_factory=list)
    pace: float = 0.0  # seconds between a stream's chunks (a slow model generating)


@dataclass
class Streamed:
    """What became of one streamed answer: chunks written, and when the client left (None: it read
    to the end)."""

    chunks: int = 0
    of: int = 0
    left_at: float | None = None  # seconds after the request arrived
    began: float = 0.0
    ended: float = 0.0  # time.monotonic() when the server stopped generating


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # the parsed JSON body, or the raw text if it did not parse
    size: int  # bytes of the body


_Server = TypeVar("_Server", bound="MessagesServer")


class MessagesServer:
    """The server; `url` is the base URL to give the client."""

    def __init__(self) -> None:
        self.script: deque[Entry] = deque()
        self.requests: list[Recorded] = []
        self.streams: list[Streamed] = []  # one per streamed answer, in order
        self.exhausted = 0
        self.slot = threading.Lock()  # held while a stream generates: one request at a time, as llama.cpp
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.02,), name="messages-server", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def push(self, *entries: Entry) -> None:
        with self._lock:
            self.script.extend(entries)

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    def start(self: _Server) -> _Server:
        """Serve in a thread; the server itself (a ChatServer's start gives the ChatServer)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _get(self, path: str) -> tuple[int, Any]:
        """A GET's answer (code, JSON body); this server has none."""
        return 404, {"error": {"message": f"no {path} here", "type": "not_found_error"}}

    def _next(self, recorded: Recorded) -> Entry:
        with self._lock:
            self.requests.append(recorded)
            if self.script:
                return self.script.popleft()
            self.exhausted += 1
        return status(
            400, {"type": "error", "error": {"type": "invalid_request_error", "message": "exhausted"}}
        )


def _handler(server: MessagesServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            code, body = server._get(self.path.split("?")[0])
            self._send(code, json.dumps(body), {})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length).decode("utf-8", "replace")
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            headers = {k.lower(): v for k, v in self.headers.items()}
            entry = server._next(Recorded(self.path, headers, body, length))
            if entry.kind == "stream":
                self._stream(entry)
                return
            if entry.delay:
                time.sleep(entry.delay)
            if entry.kind == "message":
                message = dict(entry.body)
                message.setdefault("id", f"msg_{next(_ids):04d}")
                message.setdefault("model", body.get("model", "?") if isinstance(body, dict) else "?")
                self._send(200, json.dumps(message), {})
            elif entry.kind == "status":
                payload = entry.body if isinstance(entry.body, str) else json.dumps(entry.body)
                self._send(entry.code, payload, entry.headers)
            else:
                self._send(200, entry.raw, {})

        def _stream(self, entry: Entry) -> None:
            """Server-sent events, one chunk per `pace`, generated in the server's one slot: a
            request waits for it, and it is freed only when the generation ends, which is when the
            client's connection fails a write (as llama.cpp notices a client that left)."""
            began = time.monotonic()
            record = Streamed(of=len(entry.chunks), began=began)
            with server._lock:
                server.streams.append(record)
            with server.slot:
                try:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("connection", "close")
                    self.end_headers()
                    self.wfile.flush()
                    time.sleep(entry.delay)
                    for chunk in entry.chunks:
                        self.wfile.write(f"data: {chunk}\n\n".encode())
                        self.wfile.flush()
                        record.chunks += 1
                        time.sleep(entry.pace)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:  # the client left: generation stops here
                    record.left_at = time.monotonic() - began
                record.ended = time.monotonic()
            self.close_connection = True

        def _send(self, code: int, payload: str, headers: dict[str, str]) -> None:
            data = payload.encode()
            try:
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", f"req_{next(_ids):04d}")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up (time-out): nothing to answer
                pass

    return Handler


@pytest.fixture(name="messages_server")
def messages_server_fixture() -> Iterator[MessagesServer]:
    """A started MessagesServer, stopped after the test."""
    server = MessagesServer().start()
    try:
        yield server
    finally:
        server.stop()
