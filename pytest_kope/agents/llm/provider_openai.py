"""OpenAI-compatible chat completions for the LLM agent (`--kope-agent openai:MODEL`): OpenAI itself,
DeepSeek, Qwen, OpenRouter, LiteLLM, or a vLLM, SGLang, llama.cpp or Ollama server of one's own.

Messages are plain strings (what every such server accepts) and tools are `function` tools. Replies
are streamed: a slow local server shows its progress, and a call that runs out of time is closed
(inflight.py) instead of left generating. A local server may need no key: the SDK still wants a
non-empty one, so a placeholder goes in its place.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from ...errors import ConfigError
from . import prompt
from .inflight import InFlight, http_client
from .serverinfo import ask
from .wire import CallError, Reply, ServerInfo, ToolCall, Turn, ended, not_a_status, status_error

PLACEHOLDER_KEY = "no-key"  # for servers that take no key; the SDK refuses an empty one
_STOPS = {
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
    "repeating": "repeating",
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
    streams = True  # replies come token by token (progress, and a reply that loops is cut)

    def __init__(
        self,
        model: str,
        api_key: str | None,
        base_url: str | None,
        timeout: float = 300,
        context: int | None = None,
    ):
        try:
            import openai
        except ImportError as e:
            raise ConfigError(
                f"--kope-agent openai needs the openai SDK: pip install pytest-kope ({e})"
            ) from None
        self._sdk = openai
        self.model = model
        self.secrets = [api_key] if api_key else []
        self.flight = InFlight()
        self._context = context  # --kope-llm-context: the server is not asked
        self._info: ServerInfo | None = None
        # One retry layer, the agent's (see provider_anthropic.py).
        self._client = openai.OpenAI(
            api_key=api_key or PLACEHOLDER_KEY,
            base_url=base_url or None,
            timeout=timeout,
            max_retries=0,
            http_client=http_client(openai, self.flight, timeout),
        )
        self.where = str(self._client.base_url).rstrip("/")
        self.api = f"the chat-completions API at {self.where}"

    def info(self, sample: str) -> ServerInfo:
        """The server's context size and tool-call support, asked once (`/models`, llama.cpp's
        `/props`); a context given as a setting is not asked for."""
        if self._info is None:
            given = ServerInfo(self._context, None, "--kope-llm-context") if self._context else None
            self._info = given or ask(self._client, self.model, self.where, sample)
        return self._info

    def send(
        self, system: str, turns: list[Turn], max_out: int, tools: bool, seconds: float, why: str
    ) -> Reply:
        messages = [{"role": "system", "content": system}]
        for turn in turns:
            messages += _messages(turn)
        extra: dict[str, Any] = {"tools": TOOLS} if tools else {}
        flight, said = self.flight, list[str]()
        flight.begin(seconds, why)
        try:
            if flight.ended:
                raise ended(flight, self.api)
            stream = self._client.chat.completions.create(
                model=self.model,
                max_tokens=max_out,
                messages=cast(Any, messages),
                stream=True,
                stream_options={"include_usage": True},
                timeout=seconds,
                **extra,
            )
            with stream:
                return _read(stream, flight, self.api, said)
        except CallError as e:
            e.partial = "".join(said)
            raise
        except self._sdk.APIStatusError as e:
            raise status_error(e, self.api, tools, e.response.headers) from None
        except Exception as e:  # the stream cut by its end, a lost connection, a garbled chunk
            error = not_a_status(e, self._sdk, self.api, flight)
            error.partial = "".join(said)  # what the model said before the end: kept in the record
            raise error from None
        finally:
            flight.finish()

    def close(self) -> None:
        self._client.close()


def _read(stream: Any, flight: InFlight, api: str, text: list[str]) -> Reply:
    """A streamed reply put together (its text into `text` as it comes): text, tool calls by
    index, finish reason, usage. A reply that goes round in a loop is cut there (`looping`)."""
    calls: dict[int, dict[str, Any]] = {}
    finish, usage = None, None
    for n, chunk in enumerate(stream, 1):
        if n % 64 == 0 and looping("".join(text[-400:])):
            finish = "repeating"
            break
        if getattr(chunk, "usage", None):
            usage = chunk.usage
        for choice in chunk.choices or []:
            delta = choice.delta
            if delta is not None and delta.content:
                text.append(delta.content)
                flight.got()
            for tc in (delta.tool_calls or []) if delta is not None else []:
                slot = calls.setdefault(tc.index or 0, {"id": "", "name": "", "arguments": []})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["name"] = tc.function.name or slot["name"]
                    slot["arguments"].append(tc.function.arguments or "")
                flight.got()
            finish = choice.finish_reason or finish
    if flight.ended:  # the stream ended because its socket was shut: not a whole reply
        raise ended(flight, api)
    return Reply(
        text="".join(text),
        calls=[_call(c) for _, c in sorted(calls.items()) if c["name"]],
        stop=_STOPS.get(str(finish), "end"),
        usage=_usage(usage, flight.tokens),
        first_token_s=None if flight.first is None else round(flight.first, 3),
        seconds=round(time.monotonic() - flight.started, 3),
        estimated=usage is None,
    )


def looping(tail: str) -> bool:
    """Whether a reply ends in one piece of text said over and over (a small model that has lost
    its way writes the same line until max_tokens: minutes of a slow server for nothing)."""
    for period in range(4, 301):
        times = max(6, 600 // period)
        if len(tail) >= period * times and tail[-period * times :] == tail[-period:] * times:
            return True
    return False


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


def _call(c: dict[str, Any]) -> ToolCall:
    try:
        args = json.loads("".join(c["arguments"]) or "{}")
    except ValueError:  # the tool answers that its fields are missing: the model hears it and retries
        args = {}
    return ToolCall(
        str(c["id"] or f"call_{c['name']}"), str(c["name"]), args if isinstance(args, dict) else {}
    )


def _usage(u: Any, streamed: int) -> dict[str, int]:
    """Tokens under the agent's names: input without the cached part, as Anthropic counts it. A
    server that reports no usage: the streamed pieces as the output, the input left to the agent."""
    if u is None:
        return {"input_tokens": 0, "output_tokens": streamed}
    details = getattr(u, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    used = {
        "input_tokens": int(u.prompt_tokens or 0) - int(cached or 0),
        "output_tokens": int(u.completion_tokens or 0),
    }
    if cached is not None:  # reported only by servers with a prompt cache
        used["cache_read_input_tokens"] = int(cached)
    return used
