"""The toolchain registry: built-ins answer `pytest_kope_make_toolchain` as trylast so plugins can
override them; `toolchain_of` makes one by name (once per process), `toolchain_for` finds the one that
builds a source file by its suffix (`Toolchain.extensions`).

Adding a toolchain: its own module (a `ToolchainBase` subclass) and one line in `_BUILTIN`, or, from a
plugin or conftest, the two hooks `pytest_kope_make_toolchain` and `pytest_kope_toolchain_names`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..errors import ToolchainMissing

if TYPE_CHECKING:
    from .base import Toolchain

_TOOLCHAINS = pytest.StashKey[dict[str, Any]]()
_BUILTIN = {
    "c": "pytest_kope.toolchains.c:CToolchain",
    "triton": "pytest_kope.toolchains.triton:TritonToolchain",
    "triton-ascend": "pytest_kope.toolchains.triton_ascend:TritonAscendToolchain",
    "ascendc": "pytest_kope.toolchains.ascendc:AscendCToolchain",
}


@pytest.hookimpl(trylast=True)
def pytest_kope_make_toolchain(name: str, config: pytest.Config) -> Any:
    """The built-in toolchain called `name`, or None."""
    target = _BUILTIN.get(name)
    if target is None:
        return None
    module, _, cls = target.partition(":")
    make = getattr(importlib.import_module(module), cls)
    if name == "c":  # judging children are pytest processes with the same ini, so they see it too
        target = " ".join(_ini_lines(config, "kope_c_target_flags")) or None  # else $KOPE_C_TARGET_FLAGS
        return make(allow_symbols=_ini_lines(config, "kope_allow_symbols"), target_flags=target)
    return make()


def _ini_lines(config: pytest.Config, name: str) -> list[str]:
    try:
        return list(config.getini(name) or [])
    except ValueError:  # not registered (pytest-kope's options not added to this config)
        return []


@pytest.hookimpl(tryfirst=True)  # built-ins first: they claim their suffixes before a plugin's
def pytest_kope_toolchain_names(config: pytest.Config) -> list[str]:
    """The built-in toolchains' names."""
    return list(_BUILTIN)


def names(config: pytest.Config) -> list[str]:
    """Every registered toolchain's name, built-ins first, each once."""
    found = config.hook.pytest_kope_toolchain_names(config=config)
    return list(dict.fromkeys(n for listed in found for n in listed))


def toolchain_of(config: pytest.Config, name: str) -> Toolchain:
    """The toolchain called `name`, made through the hook once per process."""
    made = config.stash.setdefault(_TOOLCHAINS, {})
    if name not in made:
        tc = config.hook.pytest_kope_make_toolchain(name=name, config=config)
        if tc is None:
            raise ToolchainMissing(f"no toolchain named {name!r} (known: {', '.join(sorted(names(config)))})")
        made[name] = tc
    return made[name]  # type: ignore[no-any-return]


def selected(config: pytest.Config) -> list[str]:
    """The toolchains this run chose for their suffixes (`selection.chosen`); a name no registered
    toolchain has is a usage error."""
    from .selection import chosen

    known = names(config)
    for name in chosen(config):
        if name not in known:
            raise pytest.UsageError(
                f"--kope-toolchain {name}: no toolchain of that name (known: {', '.join(known)})"
            )
    return chosen(config)


def for_suffix(config: pytest.Config, suffix: str) -> Toolchain | None:
    """The toolchain that builds sources ending in `suffix` in this run (None: none claims it). For an
    operator repo's conftest, before any test module imports triton::

        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            for_suffix(config, ".py").prepare_process()
    """
    name = toolchain_for(config, Path(f"kernel{suffix}"))
    return toolchain_of(config, name) if name else None


def toolchain_for(config: pytest.Config, source: Path) -> str | None:
    """The name of the first toolchain whose `extensions` include the source's suffix: those the run
    selected (`--kope-toolchain`, ini `kope_toolchain`; `selection.py`) first, then every registered one."""
    for name in dict.fromkeys([*selected(config), *names(config)]):
        try:
            tc = toolchain_of(config, name)
        except ToolchainMissing:  # listed, but no plugin makes it
            continue
        if source.suffix in getattr(tc, "extensions", ()):
            return name
    return None
