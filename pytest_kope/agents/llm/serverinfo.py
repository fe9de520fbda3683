"""What an OpenAI-compatible server says of itself before the first call: its context size and whether
its chat template does tool calls, so the first prompt is built to fit and in the protocol it can read.

Each server says it in its own place: vLLM as `max_model_len` in `/v1/models`, llama.cpp as
`meta.n_ctx` there and, with its template's capabilities, in `/props` at the server's root; OpenRouter
and LM Studio as `context_length`. A server that says nothing (llama-cpp-python, Ollama) is learned
from its first context-length error instead (wire.context_numbers). Where the server has a
`/tokenize` endpoint (llama.cpp, vLLM) it counts a sample of the prompt, so the agent's token counter
(fit.py) starts at the server's own ratio.
"""

from __future__ import annotations

from typing import Any

from .wire import ServerInfo

ASK_S = 10.0  # seconds each question may take: a server that does not answer is asked no more
_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")


def ask(client: Any, model: str, where: str, sample: str) -> ServerInfo:
    """The server's answers, or an empty ServerInfo where it gives none (never an error)."""
    quick = client.with_options(timeout=ASK_S, max_retries=0)
    context, tools, said = None, None, []
    root = where.removesuffix("/v1")
    listed = _get(quick, "/models")
    if listed is not None:
        context = model_context(listed, model)
        if context:
            said.append(f"{where}/models")
    props = _get(quick, f"{root}/props")
    if isinstance(props, dict):
        settings = props.get("default_generation_settings")
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        if isinstance(n_ctx, int) and n_ctx > 0:
            context = n_ctx  # the slot's context: what a request may use, under a model's own
            said.append(f"{root}/props")
        caps = props.get("chat_template_caps")
        if isinstance(caps, dict) and isinstance(caps.get("supports_tool_calls"), bool):
            tools = caps["supports_tool_calls"]
    counted = _post(quick, f"{root}/tokenize", {"content": sample, "prompt": sample, "model": model})
    n = None
    if isinstance(counted, dict):
        n = counted.get("count") if isinstance(counted.get("count"), int) else None
        n = n or (len(counted["tokens"]) if isinstance(counted.get("tokens"), list) else None)
    return ServerInfo(context, tools, " and ".join(dict.fromkeys(said)), n or None)


def model_context(listed: Any, model: str) -> int | None:
    """The context size `/models` gives for `model` (or for its only model: llama.cpp answers to any
    name)."""
    data = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(data, list):
        return None
    entries = [d for d in data if isinstance(d, dict)]
    mine = [d for d in entries if d.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in mine:
        meta = entry.get("meta")
        for value in [meta.get("n_ctx") if isinstance(meta, dict) else None, *map(entry.get, _CONTEXT_KEYS)]:
            if isinstance(value, int) and value > 0:
                return value
    return None


def _get(client: Any, path: str) -> Any:
    try:
        return client.get(path, cast_to=object)
    except Exception:  # noqa: BLE001 - a server without the endpoint, or none at all: nothing learned
        return None


def _post(client: Any, path: str, body: dict[str, Any]) -> Any:
    try:
        return client.post(path, body=body, cast_to=object)
    except Exception:  # noqa: BLE001 - as _get
        return None
