"""The session's decisions on judged candidates: which one beats the incumbent beyond noise (`decide`,
`judge_batch`), and whether the winner holds its gain in a fresh process (`verify`).

(`judge/controller/verdict.py` reads one candidate's events from its judging child into a `Judged`; this module
decides what the session does with judged candidates.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..candidate import Candidate
from ..judge.controller.plan import Plan
from ..judge.measure.stats import PairedRatio
from ..judge.outcome import Judged, Outcome

TIMINGS = 3  # a winner's verification is timed at most this often, for one timing on a quiet machine


class TimingJudge(Protocol):
    """What deciding asks of the judge (a `Judge`; tests/test_decide.py scripts the timings)."""

    @property
    def plan(self) -> Plan: ...

    def correctness(self, candidates: list[Candidate], /) -> list[Judged]: ...

    def performance(self, judged: Judged, reference: Candidate, /) -> Judged: ...

    def performance_many(self, judged: list[Judged], reference: Candidate, /) -> list[Judged]: ...


def beats(j: Judged, min_gain: float) -> bool:
    """Whether a timed candidate's paired ratio beats its reference by more than `min_gain`."""
    if j.ratio is None or j.ratio_low is None:
        return False
    return PairedRatio(j.ratio, j.ratio_low, j.ratio_low, len(j.timings)).beats(min_gain)


def decide(j: Judged, incumbent: Judged, min_gain: float) -> bool:
    """Set a timed candidate's speedup, and crown it BETTER when it beats the incumbent beyond noise."""
    if j.outcome == Outcome.SUSPECT or not j.timings:
        return False
    j.speedup = (incumbent.speedup or 1.0) * (j.ratio or 1.0)
    if beats(j, min_gain):
        j.outcome = Outcome.BETTER
        return True
    return False


def undecided_gain(j: Judged, min_gain: float) -> bool:
    """Timed and correct, not crowned, yet its median beats the incumbent by more than `min_gain`: the
    paired rounds hit their cap before the bound decided. A search that files such a point as "no gain"
    leaves real gains behind (measured: three points 1.08-1.10x faster than the incumbent, passed over)."""
    ratio = j.ratio
    return j.outcome == Outcome.OK and ratio is not None and ratio > 1.0 + min_gain and not beats(j, min_gain)


def within_placement(j: Judged, min_gain: float) -> bool:
    """Whether a timing's gain, its bound's low end within 1 + 2 x `min_gain`, is within what two
    processes' placement alone gave one machine code. Measured on A/A pairs with kernel servers (a
    2-core VM), a pair's own 41 rounds were sure of up to 1.05x (rmsnorm: bound's low end 1.049): 3
    pairs in 55 crowned a copy of the committed kernel on one timing, and 1 verification in 24
    passed one. A second timing, in new processes, is another draw of that placement."""
    return (j.ratio_low or 0.0) <= 1.0 + 2 * min_gain


def marginal_win(j: Judged, min_gain: float) -> bool:
    """Crowned on one timing `within_placement`."""
    return j.outcome == Outcome.BETTER and within_placement(j, min_gain)


def held_for_second_look(j: Judged, min_gain: float) -> bool:
    """Whether `j` gets one more paired timing, which alone decides: an undecided gain, or a marginal
    win, which is taken back until then. Either way its notes say why."""
    if marginal_win(j, min_gain):
        j.outcome = Outcome.OK
        j.notes.append(
            f"second look: the first timing's win, {j.ratio:.2f}x (low {j.ratio_low:.2f}), is within what two"
            " processes' placement alone gives"
        )
        return True
    if undecided_gain(j, min_gain):
        j.notes.append(f"second look: the first timing left {j.ratio:.2f}x (low {j.ratio_low:.2f}) undecided")
        return True
    return False


def time_and_decide(
    judge: TimingJudge, j: Judged, incumbent: Judged, min_gain: float, fault: Callable[[Judged], None]
) -> bool:
    """Time a correct candidate against the incumbent and decide; an undecided gain or a marginal
    win gets one second look, a whole new paired timing in new processes that alone decides (no
    pooling of the two). True: BETTER."""
    for look in (1, 2):
        judge.performance(j, incumbent.candidate)
        if j.fault:
            fault(j)
            return False
        decide(j, incumbent, min_gain)
        if look == 2 or not held_for_second_look(j, min_gain):
            return j.outcome == Outcome.BETTER
    return False


def judged_only(verdicts: list[Judged], fault: Callable[[Judged], None]) -> list[Judged]:
    """The verdicts not lost to the machinery; `fault` hears of each lost one."""
    for j in verdicts:
        if j.fault:
            fault(j)
    return [j for j in verdicts if not j.fault]


def judge_batch(
    judge: TimingJudge,
    batch: list[Candidate],
    incumbent: Judged,
    min_gain: float,
    remember: Callable[[Judged], None],
    fault: Callable[[Judged], None],
) -> list[Judged]:
    """Correctness for the batch in parallel, then each survivor timed against the then incumbent.
    A judgement lost to the machinery (`j.fault`) is left out: no verdict, no evaluation spent; `fault`
    hears of it."""
    verdicts = judged_only(judge.correctness(batch), fault)
    if len(judge.plan.devices) > 1:  # one timing worker per device, all against one incumbent
        survivors = [j for j in verdicts if j.outcome.correct]
        for look in (1, 2):  # then a second look for the undecided gains, as in `time_and_decide`
            judge.performance_many(survivors, incumbent.candidate)
            for j in judged_only(survivors, fault):
                decide(j, incumbent, min_gain)
            held = []  # a loop, not a comprehension: held_for_second_look notes and takes back
            for j in survivors:
                if look == 1 and not j.fault and held_for_second_look(j, min_gain):
                    held.append(j)
            survivors = held
        verdicts = [j for j in verdicts if not j.fault]
        winners = [j for j in verdicts if j.outcome == Outcome.BETTER]
        fastest = max(winners, key=lambda w: w.speedup or 0.0, default=None)
        for j in winners:  # only the fastest becomes the incumbent
            if j is not fastest:
                j.outcome = Outcome.OK
        for j in verdicts:
            remember(j)
        return verdicts
    for j in verdicts:
        if j.outcome.correct:
            if time_and_decide(judge, j, incumbent, min_gain, fault):
                incumbent = j
            elif j.fault:
                continue
        remember(j)
    return [j for j in verdicts if not j.fault]
