"""The messages between a test host and a kernel server: one JSON object a datagram on a socket pair
(SOCK_SEQPACKET keeps message boundaries and carries file descriptors), never a pickle: what a
kernel server says is data the host parses, not code it runs."""

from __future__ import annotations

import json
import socket
from typing import Any

MAX_MESSAGE = 1 << 22  # bytes: a block's argument sets for a thousand copies fit
MAX_FDS = 4


class Closed(EOFError):
    """The other side is gone (a kernel server that died, or a host that ended)."""


class Garbled(ValueError):
    """A message that is not one JSON object (a kernel that wrote its own bytes on the channel)."""


class Channel:
    """One end of a socket pair: `send` and `recv` whole JSON messages, with descriptors beside them."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.asked = 0  # requests sent: each answer must carry its request's number

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """A channel for this side and the other end's socket (inherited by the other process)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        return cls(mine), theirs

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(socket.socket(fileno=fd))

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.send(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Closed(str(e)) from None

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        try:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except ConnectionResetError as e:
            raise Closed(str(e)) from None
        if not data:
            for fd in fds:
                _close(fd)
            raise Closed("the other side closed the channel")
        if flags & socket.MSG_TRUNC:
            raise Garbled(f"a message over {MAX_MESSAGE} bytes")
        try:
            message = json.loads(data)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            raise Garbled(f"{data[:80]!r} is not a JSON object")
        return message, fds

    def request(self, message: dict[str, Any], fds: list[int] | None = None) -> int:
        """Send `message` numbered; returns the number its answer must carry."""
        self.asked += 1
        self.send({**message, "seq": self.asked}, fds)
        return self.asked

    def answer(self, seq: int) -> dict[str, Any]:
        """The answer to request `seq`. Anything else is bytes a kernel wrote on its channel: a
        message that answers no request is Garbled, never taken as an answer. (A kernel that knows the
        protocol can still forge one; an answer only says a call ended, and the host checks the
        outputs and keeps the clock itself.)"""
        answer, extra = self.recv()
        for fd in extra:  # a host never takes descriptors from a kernel server
            _close(fd)
        if answer.get("seq") != seq:
            raise Garbled(f"{json.dumps(answer)[:80]!r} answers no request (request #{seq} was waiting)")
        return answer

    def ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        """Send and wait for the answer."""
        return self.answer(self.request(message, fds))

    def reply(self, request: dict[str, Any], answer: dict[str, Any]) -> None:
        """The server's side: `answer` to `request`, numbered as the request was."""
        self.send({**answer, "seq": request.get("seq")})

    def close(self) -> None:
        self.sock.close()


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
