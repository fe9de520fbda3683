"""Speedup over evaluations, one PNG per operator, drawn with matplotlib (Agg, no display needed).

Each judged candidate is a point at its evaluation number: its speedup over the committed kernel where
it was timed, a cross on the axis where it failed; a step line follows the best so far. Every value is
one this run measured.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def points(candidates: Sequence[dict[str, Any]]) -> list[tuple[int, float | None, str]]:
    """(evaluation, speedup or None, outcome) from report.json's candidate entries, in judging order."""
    return [(i, c.get("speedup"), str(c.get("outcome", ""))) for i, c in enumerate(candidates, 1)]


def speedup_png(
    operator: str, candidates: Sequence[dict[str, Any]], folder: Path, cache: Path | None = None
) -> Path | None:
    """Write `<folder>/<operator>-speedup.png`; None when nothing was judged (or no matplotlib).

    matplotlib keeps its font cache in `cache` (pytest-kope passes `.kope/matplotlib`), not in ~/.cache."""
    series = points(candidates)
    if not series:
        return None
    if cache is not None and "MPLCONFIGDIR" not in os.environ:
        cache.mkdir(parents=True, exist_ok=True)
        os.environ["MPLCONFIGDIR"] = str(cache)
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return None
    timed = [(i, s, o) for i, s, o in series if s]
    failed = [i for i, s, o in series if o not in ("ok", "better") and not s]
    best, steps = 1.0, []
    for i, s, o in series:
        if o == "better" and s:
            best = max(best, s)
        steps.append((i, best))
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    try:
        ax.axhline(1.0, color="0.6", lw=0.8, ls="--", label="committed kernel")
        if timed:
            ax.scatter(
                [i for i, _, _ in timed],
                [s for _, s, _ in timed],
                c=["tab:green" if o == "better" else "tab:blue" for _, _, o in timed],
                s=22,
                zorder=3,
                label="timed candidate",
            )
        if failed:
            ax.scatter(failed, [1.0] * len(failed), marker="x", c="tab:red", s=22, zorder=3, label="failed")
        ax.step([i for i, _ in steps], [b for _, b in steps], where="post", color="tab:green", label="best")
        ax.set_xlabel("evaluation")
        ax.set_ylabel("speedup over committed kernel (search estimate)")
        ax.set_title(f"{operator}: speedup over evaluations")
        ax.set_xlim(0.5, len(series) + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        folder.mkdir(parents=True, exist_ok=True)
        out = folder / f"{operator}-speedup.png"
        fig.savefig(out)
        return out
    finally:
        plt.close(fig)
