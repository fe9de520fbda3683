"""A scripted OpenAI chat-completions server on 127.0.0.1, for testing `--kope-agent openai:MODEL`
over real HTTP with the real `openai` client (what vLLM, Ollama, llama.cpp or DeepSeek speak).

Each POST to ``/v1/chat/completions`` (or ``/chat/completions``) takes the next entry of a queue::

    server.push(
        completion(tool_call("query_experience", {"question": "what helped softmax?"})),
        status(429, headers={"retry-after": "0"}),
        completion(content="Idea: ...\\n```c\\n...\\n```"),   # a model without tools answers in text
        context_length(),                                     # 400: over the model's context length
        no_tools(),                                           # 400: the server does no tool calls
    )

Every request is recorded (path, headers, parsed JSON body) in ``server.requests``. When the queue is
empty the server answers 400 and counts it in ``server.exhausted``. The messages_server.py twin
speaks Anthropic's Messages API; both record requests the same way.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from messages_server import Entry, MessagesServer, Recorded, garbage, slow

__all__ = ["ChatServer", "completion", "context_length", "garbage", "no_tools", "slow", "status", "tool_call"]
_ids = itertools.count(1)


def tool_call(name: str, arguments: dict[str, Any] | str, id: str | None = None) -> dict[str, Any]:
    """A function tool call as the model sends it (arguments: a JSON string on the wire)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": id or f"call_{next(_ids):04d}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def usage(prompt: int = 100, completion: int = 50, cached: int | None = None) -> dict[str, Any]:
    """Token usage; `cached` (prompt_tokens_details.cached_tokens) only from servers with a cache."""
    used: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        used["prompt_tokens_details"] = {"cached_tokens": cached}
    return used


def completion(
    *calls: dict[str, Any],
    content: str | None = None,
    finish: str | None = None,
    tokens: dict[str, Any] | None = None,
) -> Entry:
    """A 200 answer: one choice with this content and these tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    body = {
        "object": "chat.completion",
        "created": 1_700_000_000,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish or ("tool_calls" if calls else "stop")}
        ],
        "usage": tokens or usage(),
    }
    return Entry("message", body=body)


def status(code: int, message: str | None = None, headers: dict[str, str] | None = None) -> Entry:
    """An HTTP error with an OpenAI-shaped error body."""
    kind = {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(code, "server_error")
    body = {"error": {"message": message or f"scripted {code}", "type": kind, "param": None, "code": None}}
    return Entry("status", code=code, body=body, headers=headers or {})


def context_length() -> Entry:
    """What vLLM answers a prompt over the model's context length."""
    return status(
        400,
        "This model's maximum context length is 8192 tokens. However, you requested 9100 tokens "
        "(8100 in the messages, 1000 in the completion). Please reduce the length of the messages.",
    )


def no_tools() -> Entry:
    """What a server answers when its model does no tool calls (vLLM without tool parsing, Ollama)."""
    return status(
        400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )


class ChatServer(MessagesServer):
    """The server; `url` is the base URL to give the client (with /v1, as OPENAI_BASE_URL is)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}/v1"

    def _next(self, recorded: Recorded) -> Entry:
        entry = super()._next(recorded)
        if entry.kind == "message" and isinstance(entry.body, dict):
            body = dict(entry.body)
            body.setdefault("id", f"chatcmpl-{next(_ids):04d}")
            body.setdefault(
                "model", recorded.body.get("model", "?") if isinstance(recorded.body, dict) else "?"
            )
            return Entry("raw", raw=json.dumps(body), delay=entry.delay)
        return entry


@pytest.fixture(name="chat_server")
def chat_server_fixture() -> Iterator[ChatServer]:
    """A started ChatServer, stopped after the test."""
    server = ChatServer().start()
    try:
        yield server
    finally:
        server.stop()
