"""Built-in toolchains, answering `pytest_kope_make_toolchain` as trylast so plugins can override them."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

_BUILTIN = {
    "c": "pytest_kope.toolchains.c:CToolchain",
    "triton": "pytest_kope.toolchains.triton:TritonToolchain",
    "triton-ascend": "pytest_kope.toolchains.triton_ascend:TritonAscendToolchain",
    "ascendc": "pytest_kope.toolchains.ascendc:AscendCToolchain",
}


@pytest.hookimpl(trylast=True)
def pytest_kope_make_toolchain(name: str, config: pytest.Config) -> Any:
    target = _BUILTIN.get(name)
    if target is None:
        return None
    module, _, cls = target.partition(":")
    make = getattr(importlib.import_module(module), cls)
    if name == "c":  # judging children are pytest processes with the same ini, so they see it too
        return make(allow_symbols=_ini_lines(config, "kope_allow_symbols"))
    return make()


def _ini_lines(config: pytest.Config, name: str) -> list[str]:
    try:
        return list(config.getini(name) or [])
    except ValueError:  # not registered (pytest-kope's options not added to this config)
        return []


def pytest_kope_toolchain_names(config: pytest.Config) -> list[str]:
    return list(_BUILTIN)
