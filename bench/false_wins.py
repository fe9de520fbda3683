"""The timing rule's A/A false-win rate: the committed kernel against an identical copy of itself.

Each pair is independent of the others: its own judge (fresh fork servers and timing children, the
perf tests' inputs made anew in them), its own twin (the source with a distinct trailing comment, so
its own build), operators taken in turn so no two pairs in a row share one. Within a pair the twin is
judged as any candidate is, with the session's rule (`session.decide.time_and_decide`): a false win
is a verdict `better` (bound above 1, median above 1 + min gain), second look included. The rate
comes with its exact (Clopper-Pearson) 95% interval, which needs no assumption beyond independence:
0 wins in 200 pairs bounds the rate below 1.9%.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kope.candidate import Candidate  # noqa: E402
from pytest_kope.judge.controller.plan import Plan  # noqa: E402
from pytest_kope.judge.controller.runner import Judge  # noqa: E402
from pytest_kope.judge.outcome import Judged  # noqa: E402
from pytest_kope.session.decide import time_and_decide  # noqa: E402
from pytest_kope.session.verify import verify  # noqa: E402
from pytest_kope.toolchains.c import CToolchain  # noqa: E402


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (no overflow for large n)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    total = 0.0
    for i in range(k + 1):
        log_term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        total += math.exp(log_term + i * math.log(p) + (n - i) * math.log1p(-p))
    return min(1.0, total)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval for a binomial rate with `k` successes in `n` trials."""
    if n <= 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2

    def solve(f: Any) -> float:  # f decreasing in p from >0 to <0: bisection to float precision
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: tail - (1.0 - binomial_cdf(k - 1, n, p)))
    high = 1.0 if k == n else solve(lambda p: binomial_cdf(k, n, p) - tail)
    return low, high


def one_pair(plan: Plan, index: int, verify_too: bool = False) -> dict[str, Any] | None:
    """One independent A/A pair: a fresh judge, a twin of its own; None when no timing came back.
    `verify_too`: the twin then goes through a winner's verification too, crowned or not (fresh
    processes, timed against the baseline): passing it is what a false commit needs."""
    plan = plan.with_settings(fork_server=True, sequential=True, record_inputs=True)  # the session's judge
    judge = Judge(plan, CToolchain().screen)
    op = plan.operator
    try:
        base = judge.baseline(op.baseline())
        twin = Candidate(
            op.text + f"\n// A/A twin {index}\n",
            op.source.name,
            op.toolchain,
            base.candidate.params,
            "A/A twin",
            "bench",
        )
        (checked,) = judge.correctness([twin])
        if not checked.outcome.correct:
            return None
        j = Judged(twin, checked.outcome)
        crowned = time_and_decide(judge, j, base, plan.settings.min_gain, lambda _: None)
        if not j.timings:
            return None
        checked_again: dict[str, Any] = {}
        if verify_too:
            fresh, why = verify(judge, base, j, plan.settings.min_gain, lambda _: None)
            said = f"verified at {fresh.speedup:.3f}x" if fresh is not None else why
            checked_again = {"verified": fresh is not None, "verification": said}
        return {
            "operator": op.name,
            "pair": index,
            "ratio": j.ratio,
            "low": j.ratio_low,
            "rounds": sum(t.rounds for t in j.timings),
            "second_look": any("second look" in n for n in j.notes),
            "false_win": crowned,
            **checked_again,
        }
    finally:
        judge.close()


def aa_pairs(
    plans: list[Plan], pairs: int, every: int = 10, minutes: float = 0.0, verify_too: bool = False
) -> list[dict[str, Any]]:
    """`pairs` independent A/A pairs, the operators taken in turn; every `every` pairs a line says
    how far it is (about 20 s a pair on 2 cores: 200 pairs take over an hour). With `minutes`, no
    pair starts after that long: the summary counts the pairs that were made, its interval wider."""
    out = []
    deadline = time.monotonic() + 60 * minutes if minutes else math.inf
    for i in range(pairs):
        if time.monotonic() > deadline:
            print(f"A/A: time is up after {i} of {pairs} pairs", flush=True)
            break
        pair = one_pair(plans[i % len(plans)], i, verify_too)
        if pair is not None:
            out.append(pair)
        if every and ((i + 1) % every == 0 or i + 1 == pairs):
            print(f"A/A: {i + 1} of {pairs} pairs, {line(summary(out))}", flush=True)
    return out


def summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The false-win rate with its exact 95% interval, and how the pairs were made."""
    wins, n = sum(bool(p["false_win"]) for p in pairs), len(pairs)
    low, high = clopper_pearson(wins, n)
    return {
        "pairs": n,
        "false_wins": wins,
        "rate": wins / n if n else None,
        "clopper_pearson_95": [low, high],
        "operators": sorted({p["operator"] for p in pairs}),
        "second_looks": sum(bool(p["second_look"]) for p in pairs),
        "verified": sum(bool(p.get("verified")) for p in pairs),
        "verifications": sum("verified" in p for p in pairs),
        "independent": "each pair its own judge (fresh fork servers and children, inputs made anew) "
        "and its own twin build; operators in turn",
    }


def line(s: dict[str, Any]) -> str:
    """The A/A result in one line: rate, exact interval, and what the pairs were."""
    if not s["pairs"]:
        return "A/A: no pair was timed"
    low, high = s["clopper_pearson_95"]
    return (
        f"A/A: {s['false_wins']} false wins in {s['pairs']} independent pairs "
        f"({100 * s['rate']:.1f}%, exact 95% interval {100 * low:.1f}%-{100 * high:.1f}%), "
        f"over {len(s['operators'])} operators, {s['second_looks']} second looks; each pair its own judge, "
        "fork servers, inputs and twin build"
        + (
            f"; {s['verified']} of {s['verifications']} twins passed a winner's verification"
            if s["verifications"]
            else ""
        )
    )
