"""Built-in agents, answering `pytest_kope_make_agent` as trylast so plugins can override them."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..errors import ConfigError


@pytest.hookimpl(trylast=True)
def pytest_kope_make_agent(name: str, config: pytest.Config) -> Any:
    if name == "auto":
        name = "claude" if os.environ.get("ANTHROPIC_API_KEY") else "tuner"
    if name == "tuner":
        from .tuner import Tuner

        return Tuner(seed=config.stash.get(_seed_key(), 0), explore_rate=explore_rate(config))
    if name.startswith("replay:"):
        from .replay import Replay

        return Replay(name.partition(":")[2], rootdir=config.rootpath)
    if name == "claude":
        from .claude import ClaudeAgent

        model = config.getoption("kope_model") or config.getini("kope_model") or os.environ.get("KOPE_MODEL")
        return ClaudeAgent(
            model=model or None,
            api_key=os.environ.get("ANTHROPIC_API_KEY"),
            base_url=os.environ.get("ANTHROPIC_BASE_URL"),
            max_tokens_run=config.getoption("kope_max_tokens") or config.getini("kope_max_tokens") or None,
        )
    if name in ("replay", "replay:"):
        raise ConfigError("--kope-agent replay needs a folder: --kope-agent replay:DIR")
    return None


def explore_rate(config: pytest.Config) -> float:
    """--kope-explore (or ini kope_explore): the least share of tuner proposals that explore."""
    from .tuner import EXPLORE_RATE

    value = config.getoption("kope_explore")
    if value is None:
        value = config.getini("kope_explore") or None
    try:
        rate = EXPLORE_RATE if value is None else float(value)
    except ValueError:
        raise ConfigError(f"--kope-explore takes a share between 0 and 1, got {value!r}") from None
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"--kope-explore takes a share between 0 and 1, got {rate}")
    return rate


def _seed_key():
    from ..settings import SEED

    return SEED
