"""OpenAI-compatible chat completions for the LLM agent (`--kope-agent openai:MODEL`): OpenAI itself,
DeepSeek, Qwen, OpenRouter, LiteLLM, or a vLLM, SGLang, llama.cpp or Ollama server of one's own.

Messages are plain strings (what every such server accepts) and tools are `function` tools. A local
server may need no key: the SDK still wants a non-empty one, so a placeholder goes in its place.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

from ...errors import ConfigError
from . import prompt
from .wire import (
    CallError,
    Reply,
    ToolCall,
    Turn,
    error_message,
    not_a_status,
    retry_after,
    status_kind,
)

PLACEHOLDER_KEY = "no-key"  # for servers that take no key; the SDK refuses an empty one
_ABOUT_TOOLS = re.compile(r"\btool", re.I)
_STOPS = {
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
    }
    for t in prompt.TOOLS
]


class OpenAIProvider:
    """Any OpenAI-compatible chat-completions server, with or without tool calling."""

    name = "openai"
    api = "the chat-completions API"

    def __init__(self, model: str, api_key: str | None, base_url: str | None, timeout: float = 120):
        try:
            import openai
        except ImportError as e:
            raise ConfigError(
                f"--kope-agent openai needs the openai SDK: pip install pytest-kope ({e})"
            ) from None
        self._sdk = openai
        self.model = model
        self.secrets = [api_key] if api_key else []
        # One retry layer, the agent's (see provider_anthropic.py).
        self._client = openai.OpenAI(
            api_key=api_key or PLACEHOLDER_KEY, base_url=base_url or None, timeout=timeout, max_retries=0
        )

    def send(self, system: str, turns: list[Turn], max_out: int, tools: bool) -> Reply:
        messages = [{"role": "system", "content": system}]
        for turn in turns:
            messages += _messages(turn)
        extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
        try:
            response = self._client.chat.completions.create(
                model=self.model, max_tokens=max_out, messages=cast(Any, messages), **extra
            )
            choice = response.choices[0]
        except (ValueError, IndexError, TypeError, self._sdk.OpenAIError) as e:
            raise self._error(e, tools) from None
        return Reply(
            text=choice.message.content or "",
            calls=[_call(c) for c in (choice.message.tool_calls or []) if getattr(c, "function", None)],
            stop=_STOPS.get(str(choice.finish_reason), "end"),
            usage=_usage(response.usage),
        )

    def _error(self, e: Exception, tools: bool) -> CallError:
        sdk = self._sdk
        if isinstance(e, sdk.APIStatusError):
            code, message = e.status_code, error_message(e)
            kind = status_kind(code, message)
            if kind == "fail" and tools and code in (400, 422) and _ABOUT_TOOLS.search(message):
                kind = "no_tools"
            return CallError(
                kind,
                f"HTTP {code} from {self.api}: {message}",
                retry_after(e.response.headers),
                f"HTTP {code}",
            )
        return not_a_status(e, sdk, self.api)

    def close(self) -> None:
        self._client.close()


def _messages(turn: Turn) -> list[dict[str, Any]]:
    if turn.role == "assistant":
        said: dict[str, Any] = {"role": "assistant", "content": turn.text}
        if turn.calls:
            said["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.input)},
                }
                for c in turn.calls
            ]
        return [said]
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": r.call_id, "content": ("error: " if r.error else "") + r.text}
        for r in turn.results
    ]
    if turn.parts:
        out.append({"role": "user", "content": "\n\n".join(turn.parts)})
    return out


def _call(c: Any) -> ToolCall:
    try:
        args = json.loads(c.function.arguments or "{}")
    except ValueError:  # the tool answers that its fields are missing: the model hears it and retries
        args = {}
    return ToolCall(str(c.id), str(c.function.name), args if isinstance(args, dict) else {})


def _usage(u: Any) -> dict[str, int]:
    """Tokens under the agent's names: input without the cached part, as Anthropic counts it."""
    if u is None:
        return {"input_tokens": 0, "output_tokens": 0}
    details = getattr(u, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    used = {
        "input_tokens": int(u.prompt_tokens or 0) - int(cached or 0),
        "output_tokens": int(u.completion_tokens or 0),
    }
    if cached is not None:  # reported only by servers with a prompt cache
        used["cache_read_input_tokens"] = int(cached)
    return used
