"""What the agent loop and a provider adapter say to each other, in neither provider's terms.

The loop keeps the conversation as `Turn`s and hears back a `Reply` or a `CallError`; an adapter
(provider_anthropic.py, provider_openai.py) turns them into its own wire format and its SDK's
exceptions into a `CallError` kind, so retries, budgets and faults are decided once, in the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from .inflight import InFlight

# Token counts under one set of names whatever the provider: input excludes what a cache served.
TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
_ABOUT_TOOLS = re.compile(r"\btool", re.I)
_CONTEXT_LENGTH = re.compile(
    r"context length|maximum context|too many tokens|prompt is too long|context size|context window", re.I
)
# The numbers a context-length error carries, as servers word them: (pattern, group of the context
# size, group of the prompt's tokens). vLLM and llama-cpp-python: "maximum context length is 4096
# tokens. However, you requested 13422 tokens (5230 in the messages, 8192 in the completion)";
# llama.cpp: "request (5230 tokens) exceeds the available context size (4096 tokens)"; Anthropic:
# "prompt is too long: 210000 tokens > 200000 maximum".
_CONTEXT_NUMBERS = (
    (re.compile(r"context length is (\d+) tokens.*?\((\d+) in the messages", re.I | re.S), 1, 2),
    (re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens", re.I), 2, 1),
    (re.compile(r"input \((\d+) tokens\) is larger than the max context size \((\d+) tokens", re.I), 2, 1),
    (re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum", re.I), 2, 1),
)


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
    stop: (
        str  # tool_use | end | max_tokens | refusal | repeating (cut: the model said one thing over and over)
    )
    usage: dict[str, int]  # TOKEN_KEYS that the provider reported
    notes: list[str] = field(default_factory=list)  # the SDK's warnings (e.g. a deprecated model)
    first_token_s: float | None = None  # seconds to the first streamed token (None: not streamed)
    seconds: float = 0.0  # the whole call
    estimated: bool = False  # the server reported no usage: output counted from the stream


class CallError(Exception):
    """A call that failed. `kind` decides what the loop does:

    stop: the key or model is refused (401/403/404): the agent stops for the run;
    retry: rate limit, overload, server error, time-out or lost connection: retried with back-off;
    context: the prompt is over the model's context length: refitted (`context`, `prompt_tokens`: the
      server's numbers, when it gave them) and sent again;
    no_tools: the server does not do tool calls: the plain-text protocol from then on;
    budget: the run's time budget ended the call: the round ends;
    cancelled: Ctrl-C (or SIGTERM) ended the call: the agent stops;
    fail: anything else (a bad request, a garbled body): the round ends.
    """

    def __init__(
        self,
        kind: str,
        what: str,
        retry_after: float | None = None,
        short: str = "",
        context: int | None = None,
        prompt_tokens: int | None = None,
    ):
        super().__init__(what)
        self.kind, self.what, self.retry_after = kind, what, retry_after
        self.short = short or what  # for the retries list: "HTTP 429", "time-out"
        self.context, self.prompt_tokens = context, prompt_tokens
        self.partial = ""  # what the model said before the call ended (a time-out), for the record


@dataclass(frozen=True)
class ServerInfo:
    """What a server says of itself before the first call: its context size and whether its chat
    template does tool calls (None: it does not say), and where that was read."""

    context: int | None = None
    tools: bool | None = None
    said_by: str = ""
    sample_tokens: int | None = None  # the server's own token count of the sample text it was given


class Provider(Protocol):
    """One wire protocol: `send` a conversation within `seconds` (a CallError of kind `why` when they
    run out), get a Reply or a CallError; `flight` is the call in flight (inflight.py)."""

    name: str  # anthropic | openai
    api: str  # for messages: "the Messages API at http://..."
    model: str
    secrets: list[str]  # texts scrubbed from everything the agent stores (the key)
    flight: InFlight
    streams: bool  # replies come token by token: a long call's progress counts them

    def send(
        self, system: str, turns: list[Turn], max_out: int, tools: bool, seconds: float, why: str
    ) -> Reply: ...

    def info(self, sample: str) -> ServerInfo: ...

    def close(self) -> None: ...


def status_kind(code: int, message: str) -> str:
    """The CallError kind of an HTTP error status, the same for every provider."""
    if code in (401, 403, 404):
        return "stop"
    if code in (400, 413) and _CONTEXT_LENGTH.search(message):
        return "context"
    return "retry" if code in (408, 409, 429) or code >= 500 else "fail"


def context_numbers(message: str, body: Any = None) -> tuple[int | None, int | None]:
    """(context size, prompt tokens) a context-length error states, where it states them: in its
    message, or (llama.cpp) as `n_ctx` and `n_prompt_tokens` beside it."""
    for pattern, ctx, prompt in _CONTEXT_NUMBERS:
        m = pattern.search(message)
        if m:
            return int(m.group(ctx)), int(m.group(prompt))
    inner = body.get("error", body) if isinstance(body, dict) else None
    if isinstance(inner, dict) and isinstance(inner.get("n_ctx"), int):
        tokens = inner.get("n_prompt_tokens")
        return int(inner["n_ctx"]), tokens if isinstance(tokens, int) else None
    return None, None


def status_error(e: Any, api: str, tools: bool, headers: Any) -> CallError:
    """An SDK's HTTP status error as a CallError, the same for every provider: a context-length
    error with the server's numbers, a 400/422 about tools as `no_tools`."""
    code, message = e.status_code, error_message(e)
    kind = status_kind(code, message)
    if kind == "fail" and tools and code in (400, 422) and _ABOUT_TOOLS.search(message):
        kind = "no_tools"
    context, prompt = (
        context_numbers(message, getattr(e, "body", None)) if kind == "context" else (None, None)
    )
    return CallError(
        kind, f"HTTP {code} from {api}: {message}", retry_after(headers), f"HTTP {code}", context, prompt
    )


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


def ended(flight: InFlight, api: str) -> CallError:
    """The CallError of a call its time-out, the time budget or Ctrl-C ended (inflight.py)."""
    kind, what, short = flight.ending(api)
    return CallError(kind, what, short=short)


def not_a_status(e: Exception, sdk: Any, api: str, flight: InFlight) -> CallError:
    """A failure without an HTTP status: the call's own end (its time-out, the time budget, Ctrl-C:
    `flight.ended`) first; then, as both SDKs name them, a time-out or a lost connection is retried;
    anything else is a reply the loop cannot read."""
    if flight.ended:
        return ended(flight, api)
    if isinstance(e, sdk.APITimeoutError):
        return CallError("retry", f"time-out talking to {api}", short="time-out")
    if isinstance(e, sdk.APIConnectionError):
        cause = e.__cause__ or e.__context__
        why = f" ({clip(cause, 120)})" if cause is not None and str(cause) else ""
        return CallError("retry", f"connection error talking to {api}{why}", short="connection error")
    return CallError("fail", f"malformed reply from {api} ({type(e).__name__}: {clip(e)})")
