"""An operator as its tests declare it: `pytest.mark.kope(name, source=..., family=..., toolchain=...)`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from .candidate import Candidate
from .spec import KernelSpec, parse_spec

MARKER = "kope"
_TOOLCHAIN_BY_SUFFIX = {".c": "c", ".cc": "c", ".cpp": "c", ".cxx": "c", ".py": "triton"}


@dataclass(frozen=True)
class Operator:
    name: str
    source: Path  # absolute path of the committed kernel source
    toolchain: str
    family: str
    rtol: float | None = None  # norm-wise tolerance of candidate against committed kernel (marker `rtol=`)

    @property
    def text(self) -> str:
        return _read(self.source)

    @property
    def spec(self) -> KernelSpec:
        return parse_spec(self.text, str(self.source))

    def baseline(self) -> Candidate:
        """The committed kernel, built at its declared defaults."""
        return Candidate(
            source=self.text,
            filename=self.source.name,
            toolchain=self.toolchain,
            params=self.spec.space.defaults,
            idea="committed kernel",
            agent="baseline",
        )


def interface_change(committed: KernelSpec, candidate: KernelSpec) -> str:
    """How a candidate's declared interface differs from the committed one ("" when it does not).

    The committed `kernel` and `inplace` lines are the oracle's: they say which arguments the guards
    treat as read-only, so a candidate may not redeclare them (it keeps its own tuning space).
    """
    norm = [" ".join(k.replace("*", " * ").replace(",", " , ").split()) for k in committed.kernels]
    theirs = [" ".join(k.replace("*", " * ").replace(",", " , ").split()) for k in candidate.kernels]
    if theirs != norm:
        return f"declares kernels {candidate.kernels} but the committed source declares {committed.kernels}"
    if candidate.inplace != committed.inplace:
        mine = ", ".join(sorted(committed.inplace)) or "none"
        return f"declares in-place arguments {', '.join(sorted(candidate.inplace)) or 'none'} (committed: {mine})"
    return ""


def _read(path: Path) -> str:
    return path.read_text()


def operator_of(item: pytest.Item) -> Operator | None:
    """The operator an item judges, from the nearest `kope` marker; None for ordinary tests."""
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None
    if not mark.args or not isinstance(mark.args[0], str):
        raise pytest.UsageError(
            f"{item.nodeid}: pytest.mark.kope needs the operator name first, e.g. "
            'pytest.mark.kope("softmax", source="softmax.c")'
        )
    name = mark.args[0]
    source = mark.kwargs.get("source") or (mark.args[1] if len(mark.args) > 1 else None)
    if not source:
        raise pytest.UsageError(f'{item.nodeid}: pytest.mark.kope("{name}") needs source="<kernel file>"')
    path = (Path(str(item.path)).parent / source).resolve()
    if not path.is_file():
        raise pytest.UsageError(
            f"{item.nodeid}: kernel source {path} of operator {name!r} does not exist; fix source= in the marker"
        )
    toolchain = mark.kwargs.get("toolchain") or _TOOLCHAIN_BY_SUFFIX.get(path.suffix)
    if toolchain is None:
        raise pytest.UsageError(
            f"{item.nodeid}: cannot tell the toolchain of {path.name}; pass toolchain=..."
        )
    rtol = mark.kwargs.get("rtol")
    if rtol is not None and not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise pytest.UsageError(
            f"{item.nodeid}: pytest.mark.kope(rtol=...) takes a number in (0, 1), got {rtol!r}"
        )
    return Operator(name, path, toolchain, mark.kwargs.get("family", name), rtol)


def is_performance_test(item: pytest.Item) -> bool:
    return "kope_bench" in getattr(item, "fixturenames", ())
