"""Which toolchain builds the operators of a suffix: chosen once for a repo, not marker by marker.

``--kope-toolchain NAME`` (repeatable) or the ini option ``kope_toolchain`` puts the named
toolchains first when an operator's toolchain is told from its source's suffix (a marker's own
``toolchain=`` still wins), so ``--kope-toolchain triton-ascend`` moves every ``.py`` operator of a
Triton repo onto triton-ascend. Judging children get the choice through ``KOPE_TOOLCHAIN`` (they
re-read the ini, not the command line). A run on plain ``triton`` where triton-ascend is installed
says so in one line (`notice`): its operators then get no Ascend lowering check.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ..operator import Operator
    from .base import Toolchain

ENV = "KOPE_TOOLCHAIN"  # the selection, comma-separated, as judging children get it


def selected(config: pytest.Config) -> list[str]:
    """The toolchains chosen for this run: the option, else the ini, else `KOPE_TOOLCHAIN`; a name no
    registered toolchain has is a usage error."""
    from . import names

    chosen = list(config.getoption("kope_toolchain", None) or [])
    if not chosen:
        try:
            chosen = list(config.getini("kope_toolchain") or [])
        except ValueError:  # the option is not registered (a config without pytest-kope's options)
            chosen = []
    if not chosen:
        chosen = [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]
    known = names(config)
    for name in chosen:
        if name not in known:
            raise pytest.UsageError(
                f"--kope-toolchain {name}: no toolchain of that name (known: {', '.join(known)})"
            )
    return chosen


def for_suffix(config: pytest.Config, suffix: str) -> Toolchain | None:
    """The toolchain that builds sources ending in `suffix` in this run (None: no toolchain claims it).

    For an operator repo's conftest, before any test module imports triton::

        def pytest_configure(config):
            for_suffix(config, ".py").prepare_process()
    """
    from pathlib import Path

    from . import toolchain_for, toolchain_of

    name = toolchain_for(config, Path(f"kernel{suffix}"))
    return toolchain_of(config, name) if name else None


def notice(config: pytest.Config, operators: Iterable[Operator]) -> str | None:
    """One line when operators run on plain `triton` while triton-ascend is the installed triton."""
    from . import devices

    on_triton = sorted({op.name for op in operators if op.toolchain == "triton"})
    if not on_triton or devices.triton_flavour() != "ascend":
        return None
    return (
        f"kope: {', '.join(on_triton)} run on toolchain 'triton', but the installed triton is "
        "triton-ascend: no Ascend lowering check; select it with --kope-toolchain triton-ascend "
        "(or ini kope_toolchain = triton-ascend; a marker's own toolchain= wins)"
    )
