"""Which toolchain builds the operators of a suffix: chosen once for a repo, not marker by marker.

``--kope-toolchain NAME`` (repeatable) or the ini option ``kope_toolchain`` puts the named
toolchains first when an operator's toolchain is told from its source's suffix (a marker's own
``toolchain=`` still wins: `toolchains.toolchain_for`), so ``--kope-toolchain triton-ascend`` moves
every ``.py`` operator of a Triton repo onto triton-ascend. Judging children get the choice through
``KOPE_TOOLCHAIN`` (they re-read the ini, not the command line). A run on plain ``triton`` where
triton-ascend is installed says so in one line (`notice`): its operators get no Ascend lowering check.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

ENV = "KOPE_TOOLCHAIN"  # the selection, comma-separated, as judging children get it


def chosen(config: pytest.Config) -> list[str]:
    """The toolchains chosen for this run: the option, else the ini, else `KOPE_TOOLCHAIN`."""
    names = list(config.getoption("kope_toolchain", None) or [])
    if not names:
        try:
            names = list(config.getini("kope_toolchain") or [])
        except ValueError:  # the option is not registered (a config without pytest-kope's options)
            names = []
    return names or [n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()]


def notice(operators: Iterable[tuple[str, str]]) -> str | None:
    """One line when operators (name, toolchain) run on plain `triton` while the installed triton is
    triton-ascend's."""
    from . import devices

    on_triton = sorted({name for name, toolchain in operators if toolchain == "triton"})
    if not on_triton or devices.triton_flavour() != "ascend":
        return None
    return (
        f"kope: {', '.join(on_triton)} run on toolchain 'triton', but the installed triton is "
        "triton-ascend: no Ascend lowering check; select it with --kope-toolchain triton-ascend "
        "(or ini kope_toolchain = triton-ascend; a marker's own toolchain= wins)"
    )
