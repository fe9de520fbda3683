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
from ..settings import setting

if TYPE_CHECKING:
    from .base import Agent


def _no_arg(kind: str, arg: str) -> None:
    if arg:
        raise ConfigError(f"--kope-agent {kind} takes no argument, got {kind}:{arg}")


def _tuner(arg: str, config: pytest.Config) -> Agent:
    _no_arg("tuner", arg)
    from ..settings import SEED
    from .tuner.agent import Tuner

    return Tuner(seed=config.stash.get(SEED, 0), explore_rate=explore_rate(config))


def _replay(arg: str, config: pytest.Config) -> Agent:
    if not arg:
        raise ConfigError("--kope-agent replay needs a folder: --kope-agent replay:DIR")
    from .replay import Replay

    return Replay(arg, rootdir=config.rootpath)


def _claude(arg: str, config: pytest.Config) -> Agent:
    from .llm import claude_agent

    return claude_agent(
        model=arg or _model(config) or None,
        api_key=os.environ.get("ANTHROPIC_API_KEY"),
        base_url=os.environ.get("ANTHROPIC_BASE_URL"),
        max_tokens=_max_tokens(config),
        **_llm(config),
    )


def _openai(arg: str, config: pytest.Config) -> Agent:
    from .llm import openai_agent, openai_endpoint

    key, url = openai_endpoint(config.getini("kope_openai_key_env"), config.getini("kope_openai_base_url"))
    return openai_agent(
        arg or _model(config), api_key=key, base_url=url, max_tokens=_max_tokens(config), **_llm(config)
    )


def _llm(config: pytest.Config) -> dict[str, Any]:
    """--kope-llm-timeout, --kope-llm-output and --kope-llm-context, as the LLM agents take them."""
    from ..settings import LlmSettings

    s = LlmSettings.from_config(config)
    return {"timeout": s.timeout, "max_output_tokens": s.output, "context": s.context}


def _model(config: pytest.Config) -> str:
    return str(setting(config, "kope_model") or os.environ.get("KOPE_MODEL") or "")


def _max_tokens(config: pytest.Config) -> Any:
    """--kope-max-tokens: the LLM tokens each operator may use."""
    return setting(config, "kope_max_tokens") or None


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


def explore_rate(config: pytest.Config) -> float:
    """--kope-explore (or ini kope_explore): the least share of tuner proposals that explore."""
    from .tuner.agent import EXPLORE_RATE

    value = setting(config, "kope_explore")
    try:
        rate = EXPLORE_RATE if value is None else float(value)
    except ValueError:
        raise ConfigError(f"--kope-explore takes a share between 0 and 1, got {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"--kope-explore takes a share between 0 and 1, got {rate}")
    return rate
