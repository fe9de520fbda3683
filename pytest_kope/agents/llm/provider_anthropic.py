"""The Anthropic Messages API for the LLM agent (`--kope-agent claude[:MODEL]`).

The system prompt and the operator block are marked for prompt caching: they are the same text every
round, so from the second call on the API serves them from its cache (cache_read_input_tokens).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, cast

from ...errors import ConfigError
from . import prompt
from .inflight import InFlight, http_client
from .wire import TOKEN_KEYS, CallError, Reply, ServerInfo, ToolCall, Turn, ended, not_a_status, status_error

DEFAULT_MODEL = "claude-sonnet-4-6"  # a current model: the SDK warns of deprecated ones
NO_KEY = "--kope-agent claude needs ANTHROPIC_API_KEY (export it, or use --kope-agent tuner)"
_CACHED = {"type": "ephemeral"}
_STOPS = {"tool_use": "tool_use", "max_tokens": "max_tokens", "refusal": "refusal"}


class AnthropicProvider:
    """Anthropic's Messages API, with the system prompt and operator block cached."""

    name = "anthropic"
    streams = False  # replies come token by token (progress, and a reply that loops is cut)

    def __init__(
        self,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 300,
        context: int | None = None,
    ):
        key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ""
        if not key.strip():
            raise ConfigError(NO_KEY)
        try:
            import anthropic
        except ImportError as e:  # a core dependency, but an environment can still lack it
            raise ConfigError(
                f"the claude agent needs the anthropic SDK: pip install pytest-kope ({e})"
            ) from None
        self._sdk = anthropic
        self.secrets = [key]
        self.model = model or os.environ.get("KOPE_MODEL") or DEFAULT_MODEL
        self.flight = InFlight()
        self._context = context
        # One retry layer, the agent's: the SDK's would sleep 0.5 s on `retry-after: 0` and hide attempts.
        kwargs: dict[str, Any] = {"api_key": key, "timeout": timeout, "max_retries": 0}
        if base_url:
            kwargs["base_url"] = base_url
        self._client = anthropic.Anthropic(**kwargs, http_client=http_client(anthropic, self.flight, timeout))
        self.api = f"the Messages API at {str(self._client.base_url).rstrip('/')}"

    def info(self, sample: str) -> ServerInfo:
        """Anthropic's models all do tool calls; their context is known only as a setting."""
        return ServerInfo(self._context, True, "--kope-llm-context" if self._context else "")

    def send(
        self, system: str, turns: list[Turn], max_out: int, tools: bool, seconds: float, why: str
    ) -> Reply:
        """One Messages-API request within `seconds` (inflight.py ends it, connection and all). The
        SDK's warnings come back as notes: under the user's `filterwarnings = error` a deprecation
        warning would otherwise raise."""
        extra: dict[str, Any] = {"tools": cast(Any, prompt.TOOLS)} if tools else {}
        flight = self.flight
        flight.begin(seconds, why)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if flight.ended:
                    raise ended(flight, self.api)
                response = self._client.messages.create(
                    model=self.model,
                    max_tokens=max_out,
                    system=cast(Any, [{"type": "text", "text": system, "cache_control": _CACHED}]),
                    messages=cast(Any, [_message(t, i == 0) for i, t in enumerate(turns)]),
                    timeout=seconds,
                    **extra,
                )
            except CallError:
                raise
            except (ValueError, self._sdk.AnthropicError) as e:  # ValueError: a garbled body
                raise self._error(e) from None
            finally:
                flight.finish()
        blocks = [b for b in (response.content or []) if b.type in ("text", "tool_use")]
        u = response.usage
        return Reply(
            text="\n".join(b.text for b in blocks if b.type == "text" and b.text.strip()),
            calls=[
                ToolCall(b.id, b.name, b.input if isinstance(b.input, dict) else {})
                for b in blocks
                if b.type == "tool_use"
            ],
            stop=_STOPS.get(str(response.stop_reason), "end"),
            usage={k: int(getattr(u, k, 0) or 0) for k in TOKEN_KEYS},
            notes=[f"{w.category.__name__}: {w.message}" for w in caught],
            seconds=round(flight.elapsed(), 3),
        )

    def _error(self, e: Exception) -> CallError:
        sdk = self._sdk
        if isinstance(e, sdk.APIStatusError):
            headers = e.response.headers
            error = status_error(e, self.api, False, headers)
            should = headers.get("x-should-retry", "")
            if error.kind in ("retry", "fail") and should in ("true", "false"):
                error.kind = "retry" if should == "true" else "fail"
            return error
        return not_a_status(e, sdk, self.api, self.flight)

    def close(self) -> None:
        self._client.close()


def _message(turn: Turn, first: bool) -> dict[str, Any]:
    """A Turn as a Messages-API message; the first turn's static block is marked for caching."""
    if turn.role == "assistant":
        said = [{"type": "text", "text": turn.text}] if turn.text.strip() else []
        uses = [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in turn.calls]
        return {"role": "assistant", "content": said + uses}
    content: list[dict[str, Any]] = [
        {
            "type": "tool_result",
            "tool_use_id": r.call_id,
            "content": r.text,
            **({"is_error": True} if r.error else {}),
        }
        for r in turn.results
    ]
    for i, text in enumerate(turn.parts):
        block: dict[str, Any] = {"type": "text", "text": text}
        content.append({**block, "cache_control": _CACHED} if first and i == 0 else block)
    return {"role": "user", "content": content}
