"""A scripted OpenAI chat-completions server on 127.0.0.1, for testing `--kope-agent openai:MODEL`
over real HTTP with the real `openai` client (what vLLM, Ollama, llama.cpp or DeepSeek speak).

Each POST to ``/v1/chat/completions`` (or ``/chat/completions``) takes the next entry of a queue::

    server.push(
        completion(tool_call("query_experience", {"question": "what helped softmax?"})),
        status(429, headers={"retry-after": "0"}),
        completion(content="Idea: ...\\n```c\\n...\\n```"),   # a model without tools answers in text
        context_length(),                                     # 400: over the model's context length
        no_tools(),                                           # 400: the server does no tool calls
        generating(completion(content="..."), pace=0.2),      # a slow model: 0.2 s per streamed token
    )

A request that asks for a stream (``"stream": true``) gets its completion as server-sent events, one
chunk per token (a word), then the usage when asked (``stream_options.include_usage``), as llama.cpp
and vLLM send them; every streamed answer is generated in the server's one slot (a second request
waits for it), and generation stops only when a write to the client fails (``server.streams`` says
how many chunks went out and when the client left).

``ChatServer(context=4096, tools=False)`` behaves as llama.cpp was seen to: ``/v1/models`` and
``/props`` state the context and that the chat template does no tool calls, ``/tokenize`` counts a
text (``CHARS_PER_TOKEN`` characters a token), and a request whose prompt is over the context is
answered 400 with llama.cpp's message before it takes an entry (``server.overflows`` counts them);
``tools`` in a request are ignored. Every request is recorded (path, headers, parsed JSON body) in
``server.requests``. When the queue is empty the server answers 400 and counts it in
``server.exhausted``. The messages_server.py twin speaks Anthropic's Messages API.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
from messages_server import Entry, MessagesServer, Recorded, Streamed, garbage, slow

__all__ = [
    "ChatServer",
    "Streamed",
    "completion",
    "context_length",
    "garbage",
    "generating",
    "llama_context",
    "no_tools",
    "slow",
    "status",
    "tool_call",
]
_ids = itertools.count(1)
CHARS_PER_TOKEN = 2.2  # the scripted tokenizer: as dense as llama.cpp's Gemma tokenizer on C


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
    """A 200 answer: one choice with this content and these tool calls (usage: `tokens`, else the
    server's own count of the prompt and of the reply's words)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    body = {
        "object": "chat.completion",
        "created": 1_700_000_000,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish or ("tool_calls" if calls else "stop")}
        ],
    }
    if tokens is not None:
        body["usage"] = tokens
    return Entry("message", body=body)


def generating(entry: Entry, pace: float, first: float = 0.0) -> Entry:
    """`entry`, streamed slowly: `first` seconds to the first token, then `pace` seconds per token."""
    entry.pace, entry.delay = pace, first
    return entry


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


def llama_context(prompt: int, context: int) -> Entry:
    """What llama.cpp answers a prompt over its context: its message, and the numbers beside it."""
    message = (
        f"request ({prompt} tokens) exceeds the available context size ({context} tokens), try increasing it"
    )
    body = {
        "error": {
            "code": 400,
            "message": message,
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt,
            "n_ctx": context,
        }
    }
    return Entry("status", code=400, body=body)


def no_tools() -> Entry:
    """What a server answers when its model does no tool calls (vLLM without tool parsing, Ollama)."""
    return status(
        400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    )


def count(text: str) -> int:
    """The scripted server's tokenizer."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def prompt_tokens(body: Any) -> int:
    """A request's prompt in the server's tokens: its messages (and tools, when it reads them)."""
    if not isinstance(body, dict):
        return 0
    text = "".join(
        str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "") for m in body.get("messages", [])
    )
    return count(text) + 8 * len(body.get("messages", []))


class ChatServer(MessagesServer):
    """The server; `url` is the base URL to give the client (with /v1, as OPENAI_BASE_URL is)."""

    def __init__(self, context: int | None = None, tools: bool | None = None, says: bool = True) -> None:
        super().__init__()
        self.context, self.tools = context, tools  # as llama.cpp states them; None: says nothing
        self.says = says  # False: the context holds, but /models, /props and /tokenize say nothing
        self.overflows = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}/v1"

    def _get(self, path: str) -> tuple[int, Any]:
        if self.context is None or not self.says:
            return super()._get(path)
        if path.endswith("/models"):
            meta = {"n_ctx": self.context, "n_ctx_train": 32768, "n_vocab": 262144}
            return 200, {"object": "list", "data": [{"id": "scripted.gguf", "object": "model", "meta": meta}]}
        if path == "/props":
            caps = {"supports_tool_calls": bool(self.tools), "supports_tools": bool(self.tools)}
            settings = {"n_ctx": self.context}
            return 200, {
                "default_generation_settings": settings,
                "chat_template_caps": caps,
                "total_slots": 1,
            }
        return super()._get(path)

    def _next(self, recorded: Recorded) -> Entry:
        body = recorded.body if isinstance(recorded.body, dict) else {}
        if not recorded.path.endswith("/chat/completions"):  # /tokenize: llama.cpp's, not scripted
            if self.context is None or not self.says or recorded.path != "/tokenize":
                return status(404, f"no {recorded.path} here")
            return Entry("raw", raw=json.dumps({"tokens": list(range(count(str(body.get("content", "")))))}))
        if self.context is not None and prompt_tokens(body) > self.context:
            with self._lock:
                self.requests.append(recorded)
                self.overflows += 1
            return llama_context(prompt_tokens(body), self.context)
        entry = super()._next(recorded)
        if entry.kind != "message" or not isinstance(entry.body, dict):
            return entry
        answer = dict(entry.body)
        answer.setdefault("id", f"chatcmpl-{next(_ids):04d}")
        answer.setdefault("model", body.get("model", "?"))
        message = answer["choices"][0]["message"]
        words = _words(message)
        answer.setdefault("usage", usage(prompt_tokens(body), len(words)))
        if not body.get("stream"):
            return Entry("raw", raw=json.dumps(answer), delay=entry.delay)
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return Entry("stream", chunks=_chunks(answer, words, include), delay=entry.delay, pace=entry.pace)


def _words(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A message as the deltas a server streams: its content word by word, each tool call's name
    then its arguments in pieces."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": None}]
    deltas += [{"content": w} for w in re.findall(r"\s*\S+\s*", message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        args = call["function"]["arguments"]
        deltas += [
            {"tool_calls": [{"index": i, "function": {"arguments": args[j : j + 16]}}]}
            for j in range(0, len(args), 16)
        ]
    return deltas


def _chunks(answer: dict[str, Any], deltas: list[dict[str, Any]], include_usage: bool) -> list[str]:
    base = {
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
    }
    finish = answer["choices"][0]["finish_reason"]
    out = [json.dumps({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    out.append(json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if include_usage and answer.get("usage"):
        out.append(json.dumps({**base, "choices": [], "usage": answer["usage"]}))
    return out


@pytest.fixture(name="chat_server")
def chat_server_fixture() -> Iterator[ChatServer]:
    """A started ChatServer, stopped after the test."""
    server = ChatServer().start()
    try:
        yield server
    finally:
        server.stop()
