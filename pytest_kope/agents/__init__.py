"""The agent registry: built-ins answer `pytest_kope_make_agent` as trylast so plugins can override them.

`--kope-agent KIND[:ARG]` names an agent; `_BUILTIN` maps each built-in KIND to the function that
makes it from ARG and the config. Adding an agent: its own module and one line there (or, from a
plugin or conftest, the hook `pytest_kope_make_agent`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import ConfigError
from ..settings import LlmSettings

if TYPE_CHECKING:
    from .base import Agent


def _no_arg(kind: str, arg: str) -> None:
    if arg:
        raise ConfigError(f"--kope-agent {kind} takes no argument, got {kind}:{arg}")


def _tuner(arg: str, config: pytest.Config) -> Agent:
    _no_arg("tuner", arg)
    from ..settings import SEED, Settings
    from .tuner.agent import Tuner

    return Tuner(seed=config.stash.get(SEED, 0), explore_rate=Settings.from_config(config).explore)


def _replay(arg: str, config: pytest.Config) -> Agent:
    if not arg:
        raise ConfigError("--kope-agent replay needs a folder: --kope-agent replay:DIR")
    from .replay import Replay

    return Replay(arg, rootdir=config.rootpath)


def _claude(arg: str, config: pytest.Config) -> Agent:
    from .llm import claude_agent

    s = LlmSettings.from_config(config)
    return claude_agent(
        model=arg or s.model or None,
        api_key=os.environ.get("ANTHROPIC_API_KEY"),
        base_url=os.environ.get("ANTHROPIC_BASE_URL"),
        max_tokens=s.max_tokens,
        **_limits(s),
    )


def _openai(arg: str, config: pytest.Config) -> Agent:
    from .llm import openai_agent, openai_endpoint

    s = LlmSettings.from_config(config)
    key, url = openai_endpoint(s.openai_key_env, s.openai_base_url)
    return openai_agent(arg or s.model, api_key=key, base_url=url, max_tokens=s.max_tokens, **_limits(s))


def _limits(s: LlmSettings) -> dict[str, Any]:
    """--kope-llm-timeout, --kope-llm-output and --kope-llm-context, as the LLM agents take them."""
    return {"timeout": s.timeout, "max_output_tokens": s.output, "context": s.context}


_BUILTIN: dict[str, Callable[[str, pytest.Config], Agent]] = {
    "tuner": _tuner,
    "claude": _claude,
    "openai": _openai,
    "replay": _replay,
}


def names() -> list[str]:
    """The built-in agents' kinds."""
    return list(_BUILTIN)


@pytest.hookimpl(trylast=True)
def pytest_kope_make_agent(name: str, config: pytest.Config) -> Any:
    """The built-in agent `name` names (`auto`: claude with ANTHROPIC_API_KEY, else tuner), or None."""
    if name == "auto":
        name = "claude" if os.environ.get("ANTHROPIC_API_KEY") else "tuner"
    kind, _, arg = name.partition(":")
    make = _BUILTIN.get(kind)
    return make(arg, config) if make is not None else None
