"""What crosses the boundary between a judging child and the controller: signed, typed events.

A child writes one JSON object a line, each signed with a key the controller handed it through a
pipe that the child drained before any candidate code was loaded: a kernel can write lines into the
results file, but cannot sign them. The controller reads only signed lines, and decides outcomes from
the events' `event` and `kind` fields, never from message text.

Events: `collected` (items: id, test, fresh), `start` (test), `report` (test, when, outcome, kind,
message), `build_failed` (kind: compile_failed | rejected), `timing` (a paired timing, with
`suspect` and `mismatch`), `recorded` (count; asserted: the loosest bound and the largest error of
the tests' `assert_close` calls), `replayed` (problems), `shrunk` (smallest: a minimal
drawn input the candidate fails, `draws.py`), `done` (with the clock readings
and seconds the bench splits a judgement by); from a build step: `built` or `build_failed`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from .controller import files

EVENTS = frozenset(
    {
        "collected",
        "start",
        "report",
        "build_failed",
        "built",
        "timing",
        "recorded",
        "replayed",
        "shrunk",
        "done",
    }
)


def read_key(fd: int | None) -> bytes:
    """The controller's signing key, from a pipe drained and closed before any candidate code is loaded:
    a kernel (native code in this process) can write lines into results.jsonl, but cannot sign them."""
    if fd is None:
        return b""
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def sign(key: bytes, payload: str) -> str:
    """The payload with an HMAC of it under `key`, as one line."""
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest() + " " + payload


def verify(key: bytes, line: str) -> str | None:
    """The payload of a line `sign` wrote with `key`, else None."""
    mac, _, payload = line.partition(" ")
    good = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
    return payload if hmac.compare_digest(mac, good) else None


def read_events(path: Path, key: bytes) -> tuple[list[dict[str, Any]], int]:
    """The child's signed events, and how many lines were not signed with `key` (forged by a kernel)."""
    if not path.exists():
        return [], 0
    out, forged = [], 0
    lines = files.read_text(path).splitlines()  # a link there is not followed
    for i, line in enumerate(lines):
        payload = verify(key, line)
        if payload is None:
            forged += i < len(lines) - 1 or line.endswith("}")  # not a last line cut short by a crash
            continue
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            forged += 1
            continue
        if isinstance(event, dict) and event.get("event") in EVENTS:
            out.append(event)
    return out, forged
