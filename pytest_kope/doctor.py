"""`pytest --kope-check` (and `kope doctor`): what pytest-kope sees in a repo, before any optimizing.

For each operator: its toolchain and whether it is available, its sources and include directories,
which tests judge correctness and which time it, which take fresh inputs, and whether the committed
kernel passes its correctness tests in a judging child (the same path an optimize run takes, with the
differential check's recording). The run's header already says which isolation candidates get.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from .errors import KopeError
from .judge.runner import Judge
from .session.loop import plan_for

if TYPE_CHECKING:
    from .session.session import KopeSession, OperatorRun


def check(kope: KopeSession) -> int:
    """Print the table; returns how many operators cannot be optimized as they are."""
    rows, broken = [], 0
    for run in kope.operators.values():
        row = _check_one(kope, run)
        broken += row["committed kernel"] != "passes"
        rows.append(row)
    kope.say(tabulate(rows, headers="keys", tablefmt="simple"))
    kope.say(
        f"kope: {len(rows)} operator(s), {len(rows) - broken} ready to optimize"
        + (f", {broken} not: see above" if broken else "")
    )
    return broken


def _check_one(kope: KopeSession, run: OperatorRun) -> dict[str, Any]:
    op = run.op
    row: dict[str, Any] = {
        "operator": op.name,
        "toolchain": op.toolchain,
        "sources": ", ".join(p.name for p in (op.source, *op.companions)),
        "includes": ", ".join(
            str(p.relative_to(kope.home)) if p.is_relative_to(kope.home) else str(p) for p in op.includes
        )
        or "-",
        "built by": _built_by(op),
    }
    try:
        plan, tc = plan_for(kope, run)
    except KopeError as e:
        return {
            **row,
            "correctness": "-",
            "performance": "-",
            "fresh inputs": "-",
            "committed kernel": f"cannot judge: {e}",
        }
    judge = Judge(plan, tc.screen)
    try:
        base = judge.baseline(op.baseline())
    finally:
        judge.close()
    timer = tc.timer()
    fresh = len(set(plan.correctness) - set(base.fixed_inputs))
    verdict = (
        "passes" if base.outcome.correct else f"{base.outcome.value}: {(base.failures or ['?'])[0][:200]}"
    )
    return {
        **row,
        "correctness": len(plan.correctness),
        "performance": len(plan.performance)
        if timer.can_time
        else f"{len(plan.performance)} (not timed: {timer.why_not})",
        "fresh inputs": f"{fresh} of {len(plan.correctness)}",
        "committed kernel": verdict,
    }


def _built_by(op: Any) -> str:
    """Who compiles the kernel after a merge, and so which tuning a winner's branch can carry."""
    if not op.own_build:
        return "pytest-kope (params and flags searched)"
    return f"{op.own_build}: params searched, flags held"
