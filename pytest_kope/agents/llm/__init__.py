"""The LLM agent: one loop (agent.py) with its prompt (prompt.py) and tools (tools.py), and a provider
adapter per wire protocol: Anthropic's Messages API (`claude`) and OpenAI-compatible chat completions
(`openai:MODEL`). Keys come from the environment only: ini options may name the variable, never hold
the key."""

from __future__ import annotations

import os
import re
from typing import Any

from ...errors import ConfigError
from .agent import LlmAgent
from .calls import Limits
from .provider_anthropic import DEFAULT_MODEL, AnthropicProvider
from .provider_openai import OpenAIProvider
from .tools import merge_space
from .wire import Provider

__all__ = [
    "DEFAULT_MODEL",
    "Limits",
    "LlmAgent",
    "claude_agent",
    "merge_space",
    "openai_agent",
    "openai_endpoint",
]
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def claude_agent(
    model: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    timeout: float = Limits.timeout,
    context: int | None = None,
    **options: Any,
) -> LlmAgent:
    """`--kope-agent claude[:MODEL]`: the loop on Anthropic's Messages API."""
    provider = AnthropicProvider(model, api_key, base_url, timeout, context)
    return _agent(provider, "claude", {"timeout": timeout, **options})


def openai_agent(
    model: str,
    api_key: str | None = None,
    base_url: str | None = None,
    timeout: float = Limits.timeout,
    context: int | None = None,
    **options: Any,
) -> LlmAgent:
    """`--kope-agent openai:MODEL`: the loop on an OpenAI-compatible chat-completions server. A
    server given by its base URL may need no key (a local vLLM, Ollama or llama.cpp)."""
    if not model:
        raise ConfigError("--kope-agent openai needs a model: --kope-agent openai:MODEL (or --kope-model)")
    if not (api_key or "").strip() and not base_url:
        raise ConfigError(
            "--kope-agent openai needs OPENAI_API_KEY (or the variable kope_openai_key_env names), "
            "or the base URL of a server that takes no key (OPENAI_BASE_URL or kope_openai_base_url)"
        )
    provider = OpenAIProvider(model, api_key or None, base_url, timeout, context)
    return _agent(provider, "openai", {"timeout": timeout, **options})


def _agent(provider: Provider, name: str, options: dict[str, Any]) -> LlmAgent:
    """The loop on `provider`: `max_tokens` and `graph_sink` as given, every other option a `Limits`."""
    given = dict(options)
    max_tokens, graph_sink = given.pop("max_tokens", None), given.pop("graph_sink", None)
    return LlmAgent(provider, name, max_tokens, graph_sink, Limits(**given))


def openai_endpoint(key_env: str | None, base_url: str | None) -> tuple[str | None, str | None]:
    """(key, base URL) from the environment. `key_env` (ini kope_openai_key_env) names the variable
    holding the key, default OPENAI_API_KEY; `base_url` (ini kope_openai_base_url) is a URL or the
    name of a variable holding one, default OPENAI_BASE_URL."""
    var = (key_env or "OPENAI_API_KEY").strip()
    if not _VARIABLE.match(var):
        raise ConfigError(
            "kope_openai_key_env names the environment variable that holds the key (e.g. DEEPSEEK_API_KEY);"
            " never put the key itself in an ini file"
        )
    url = (base_url or "").strip()
    if url and _VARIABLE.match(url):
        url = os.environ.get(url, "")
    return os.environ.get(var) or None, url or os.environ.get("OPENAI_BASE_URL") or None
