"""What the agent loop and a provider adapter say to each other, in neither provider's terms.

The loop keeps the conversation as `Turn`s and hears back a `Reply` or a `CallError`; an adapter
(provider_anthropic.py, provider_openai.py) turns them into its own wire format and its SDK's
exceptions into a `CallError` kind, so retries, budgets and faults are decided once, in the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

# Token counts under one set of names whatever the provider: input excludes what a cache served.
TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
_CONTEXT_LENGTH = re.compile(r"context length|maximum context|too many tokens|prompt is too long", re.I)


@dataclass
class ToolCall:
    """A tool the model called, with its parsed arguments."""

    id: str
    name: str
    input: dict[str, Any]


@dataclass
class ToolResult:
    """What a tool answered, going back to the model."""

    call_id: str
    name: str
    text: str
    error: bool = False


@dataclass
class Turn:
    """One message: `user` (texts; the first turn's are the static and dynamic blocks), `assistant`
    (its text and tool calls) or `tools` (the tool results, then any further user texts)."""

    role: str
    parts: list[str] = field(default_factory=list)
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)


@dataclass
class Reply:
    """One answered call: the model's text, its tool calls, why it stopped, what it cost."""

    text: str
    calls: list[ToolCall]
    stop: str  # tool_use | end | max_tokens | refusal
    usage: dict[str, int]  # TOKEN_KEYS that the provider reported
    notes: list[str] = field(default_factory=list)  # the SDK's warnings (e.g. a deprecated model)


class CallError(Exception):
    """A call that failed. `kind` decides what the loop does:

    stop: the key or model is refused (401/403/404): the agent stops for the run;
    retry: rate limit, overload, server error, time-out or lost connection: retried with back-off;
    context: the prompt is over the model's context length: shrunk once and retried;
    no_tools: the server does not do tool calls: the plain-text protocol from then on;
    fail: anything else (a bad request, a garbled body): the round ends.
    """

    def __init__(self, kind: str, what: str, retry_after: float | None = None, short: str = ""):
        super().__init__(what)
        self.kind, self.what, self.retry_after = kind, what, retry_after
        self.short = short or what  # for the retries list: "HTTP 429", "time-out"


class Provider(Protocol):
    """One wire protocol: `send` a conversation, get a Reply or a CallError."""

    name: str  # anthropic | openai
    api: str  # for messages: "the Messages API"
    model: str
    secrets: list[str]  # texts scrubbed from everything the agent stores (the key)

    def send(self, system: str, turns: list[Turn], max_out: int, tools: bool) -> Reply: ...

    def close(self) -> None: ...


def status_kind(code: int, message: str) -> str:
    """The CallError kind of an HTTP error status, the same for every provider."""
    if code in (401, 403, 404):
        return "stop"
    if code in (400, 413) and _CONTEXT_LENGTH.search(message):
        return "context"
    return "retry" if code in (408, 409, 429) or code >= 500 else "fail"


def retry_after(headers: Any) -> float | None:
    """Seconds the server asks to wait (retry-after-ms or retry-after), if it says."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return max(float(headers.get(name)) * scale, 0.0)
        except (TypeError, ValueError, AttributeError):
            pass
    return None


def error_message(e: Exception) -> str:
    """The server's own message in an SDK status error (both SDKs keep the JSON body)."""
    body = getattr(e, "body", None)
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and inner.get("message"):
        return clip(inner["message"], 300)
    return clip(getattr(e, "message", "") or e, 300)


def clip(text: object, limit: int = 200) -> str:
    """An error message on one line, short enough for a fault note."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def not_a_status(e: Exception, sdk: Any, api: str) -> CallError:
    """A failure without an HTTP status, as both SDKs name them: a time-out or a lost connection is
    retried; anything else is a reply the loop cannot read."""
    if isinstance(e, sdk.APITimeoutError):
        return CallError("retry", f"time-out talking to {api}", short="time-out")
    if isinstance(e, sdk.APIConnectionError):
        return CallError("retry", f"connection error talking to {api}", short="connection error")
    return CallError("fail", f"malformed reply from {api} ({type(e).__name__}: {clip(e)})")
