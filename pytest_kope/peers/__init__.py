"""Kernel-only peers and the measured roofline: how fast a kernel is next to what a user would pick
instead (torch eager with `out=`, `torch.compile` into a preallocated buffer, numpy/OpenBLAS), and
how close it comes to this machine's memory bandwidth or FMA peak.

Shared by `bench/peers.py` (all sample operators: committed kernel, winner on `kope/<op>`, peers) and
`--kope-peers` (the winner-vs-peer headline in report.md and the PR body). Informational only: nothing
here decides a verdict. Timing loads kernels, so the plugin runs it in a child
(`python -m pytest_kope.peers`), never in the controller.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from tabulate import tabulate

from .cases import CASES, Case, Problem
from .isa import ISAS, Isa, isa, missing_env, peer_report, wide_code
from .measure import KERNEL, PEER, Comparison, Setup, Timed, compare, use_threads

__all__ = [
    "CASES",
    "ISAS",
    "KERNEL",
    "PEER",
    "Case",
    "Comparison",
    "Isa",
    "Problem",
    "Timed",
    "Setup",
    "compare",
    "default_threads",
    "headline",
    "import_torch",
    "isa",
    "missing_env",
    "peer_report",
    "table",
    "use_threads",
    "versions",
    "wide_code",
]


def default_threads() -> int:
    """The CPUs this process may use: every contender gets that many threads."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def import_torch() -> Any:
    """torch, or None when it is not installed (then only numpy peers take part). Its own deprecation
    warnings at import (torch.jit) are not the caller's to see."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import torch
    except ImportError:
        return None
    return torch


def versions(torch: Any) -> dict[str, str]:
    """The peers' library versions, for the table and the report."""
    import numpy

    return {"numpy": numpy.__version__, "torch": getattr(torch, "__version__", "not installed")}


def _ratio(t: Timed) -> str:
    if t.vs_best_peer is None:
        return "-"
    return f"{t.vs_best_peer:.2f}x [{t.vs_best_peer_low:.2f}, {t.vs_best_peer_high:.2f}]"


def _ms(t: Timed) -> str:
    return f"{t.median_s * 1e3:.3g} [{t.low_s * 1e3:.3g}, {t.high_s * 1e3:.3g}]"


def table(results: list[Comparison]) -> str:
    """One row per contender: time, speed relative to the operator's best peer, fraction of the roof;
    the header names the instruction set measured at (native, or avx2 on an AVX-512 machine)."""
    rows = []
    for r in results:
        unit = "GFLOP/s" if r.roof == "fma" else "GB/s"
        for t in r.timed:
            star = " (best peer)" if t.label == r.best_peer else ""
            rows.append(
                (
                    r.operator,
                    f"{t.label}{star}" + ("" if t.correct else " WRONG OUTPUT"),
                    _ms(t),
                    _ratio(t),
                    f"{t.roof_fraction:.2f} of {r.roof} {r.roof_value:.0f} {unit}",
                )
            )
    isas = ", ".join(sorted({r.isa for r in results}))
    operator = f"operator ({isas} ISA)" if isas else "operator"
    headers = [operator, "contender", "ms per call [95%]", "speed vs best peer [95%]", "roofline"]
    return tabulate(rows, headers=headers)


def headline(result: Comparison, label: str) -> str:
    """One line for a report: `label`'s speed relative to the best peer, with its interval and roof."""
    t = result.get(label)
    if t is None or result.best_peer is None or t.vs_best_peer is None:
        return f"{result.operator}: no peer to compare with"
    if not t.correct:
        return f"{result.operator}: {label}'s output differs from the reference here; no comparison"
    lo, hi = t.vs_best_peer_low or 0.0, t.vs_best_peer_high or 0.0
    if lo > 1:
        said = f"{t.vs_best_peer:.2f}x faster than"
    elif hi < 1:
        said = f"{1 / t.vs_best_peer:.2f}x slower than"
    else:
        said = f"as fast as ({t.vs_best_peer:.2f}x)"
    return (
        f"{result.operator}: now {said} {result.best_peer} on this machine "
        f"(95% interval {lo:.2f}-{hi:.2f}, {result.threads} threads; {t.roof_fraction:.2f} of the measured "
        f"{result.roof} roof)"
    )
