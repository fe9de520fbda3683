"""The session's decision on a timed candidate: crowned only beyond noise, and a gain the rounds' cap
left undecided gets one second look instead of being filed as "no gain".

The paired timings are scripted (a stand-in for the judge's `performance`, which fills `timings`), so
each case is decided by the rule alone, not by this machine's noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from pytest_kope.candidate import Candidate
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.operator import Operator
from pytest_kope.session.decide import judge_batch, time_and_decide, undecided_gain
from pytest_kope.session.verify import verify

GAIN = 0.05


def timing(ratio: float, low: float, high: float) -> Timing:
    return Timing("t::perf", 1.0, 1.0 / ratio, ratio, low, high, 41)


def plan(devices: tuple[int, ...] = ()) -> Plan:
    """The judge's plan, of which decide reads the devices (none: one timing worker, on the CPU)."""
    op = Operator(name="k", source=Path("k.c"), toolchain="c", family="elementwise")
    return Plan(
        operator=op,
        rootdir=Path("."),
        inifile=None,
        files=[],
        correctness=[],
        performance=[],
        devices=devices,
    )


class ScriptedTimings:
    """Hands out the paired timings of a script, one per `performance` call; a str is a lost judgement."""

    def __init__(self, *script: Timing | str) -> None:
        self.script, self.calls = list(script), 0
        self.plan = plan()

    def performance(self, j: Judged, reference: Candidate) -> Judged:
        step = self.script[self.calls]
        self.calls += 1
        if isinstance(step, str):
            j.fault = step
        else:
            j.timings = [step]
        return j

    def correctness(self, batch: list[Candidate]) -> list[Judged]:
        return [Judged(c, Outcome.OK) for c in batch]

    def performance_many(self, judged: list[Judged], reference: Candidate) -> list[Judged]:
        return [self.performance(j, reference) for j in judged]


def judged(name: str) -> Judged:
    return Judged(Candidate(f"// {name}\n", "k.c", "c", {"X": name}), Outcome.OK)


def dropped(j: Judged) -> None:
    """Where the verdicts or faults go that a case does not look at."""


def incumbent() -> Judged:
    j = judged("incumbent")
    j.speedup = 2.0
    return j


def test_an_undecided_gain_gets_a_second_look_that_can_crown_it() -> None:
    judge = ScriptedTimings(timing(1.09, 0.98, 1.20), timing(1.10, 1.04, 1.15))
    j = judged("a")
    faults: list[Judged] = []
    assert undecided_gain(_timed(j, 1.09, 0.98, 1.20), GAIN)
    assert time_and_decide(judge, judged("a"), incumbent(), GAIN, faults.append)
    assert judge.calls == 2 and not faults


def test_the_second_look_alone_decides_and_there_is_no_third() -> None:
    judge = ScriptedTimings(timing(1.09, 0.98, 1.20), timing(1.07, 0.97, 1.18), timing(1.5, 1.4, 1.6))
    j = judged("b")
    assert not time_and_decide(judge, j, incumbent(), GAIN, dropped)
    assert judge.calls == 2 and j.outcome == Outcome.OK
    assert j.ratio == 1.07 and j.speedup == 2.0 * 1.07  # the second timing is the record
    assert any("second look" in n and "1.09x" in n for n in j.notes)


def test_a_decided_verdict_is_not_timed_again() -> None:
    for first in (timing(1.30, 1.20, 1.40), timing(1.02, 0.95, 1.04), timing(1.04, 0.99, 1.10)):
        judge = ScriptedTimings(first, timing(2.0, 1.9, 2.1))
        time_and_decide(judge, judged("c"), incumbent(), GAIN, dropped)
        assert judge.calls == 1, first  # crowned, decided not better, or a median gain below 5%


def test_a_marginal_win_stands_only_if_a_second_timing_wins_too() -> None:
    """Two processes' placement alone gave one machine code up to 1.05x with its bound at 1.049 (A/A
    pairs with kernel servers): a win whose bound's low end is within 1 + 2 x the gain is timed again,
    in new processes, and that timing alone decides; a clear win is not."""
    lost = ScriptedTimings(timing(1.07, 1.02, 1.12), timing(1.01, 0.95, 1.05))
    j = judged("e")
    assert not time_and_decide(lost, j, incumbent(), GAIN, dropped)
    assert lost.calls == 2 and j.outcome == Outcome.OK
    assert any("second look" in n and "1.07x" in n and "placement" in n for n in j.notes)
    held = ScriptedTimings(timing(1.07, 1.02, 1.12), timing(1.08, 1.03, 1.12))
    assert time_and_decide(held, judged("f"), incumbent(), GAIN, dropped) and held.calls == 2
    clear = ScriptedTimings(timing(1.30, 1.11, 1.40), timing(0.5, 0.4, 0.6))
    assert time_and_decide(clear, judged("g"), incumbent(), GAIN, dropped) and clear.calls == 1


def test_a_lost_timing_is_a_fault_not_a_second_look() -> None:
    judge = ScriptedTimings("the fork server died")
    faults: list[Judged] = []
    assert not time_and_decide(judge, judged("d"), incumbent(), GAIN, faults.append)
    assert judge.calls == 1 and len(faults) == 1


def test_judge_batch_crowns_after_a_second_look_and_times_the_next_against_it() -> None:
    judge = ScriptedTimings(timing(1.09, 0.98, 1.20), timing(1.10, 1.04, 1.15), timing(1.02, 0.9, 1.1))
    a, b = judged("a").candidate, judged("b").candidate
    remembered: list[Judged] = []
    verdicts = judge_batch(judge, [a, b], incumbent(), GAIN, remembered.append, dropped)
    assert [v.outcome for v in verdicts] == [Outcome.BETTER, Outcome.OK]
    assert verdicts[1].speedup == 2.0 * 1.10 * 1.02  # b's ratio is against a, the new incumbent
    assert remembered == verdicts


def _timed(j: Judged, ratio: float, low: float, high: float) -> Judged:
    j.timings = [timing(ratio, low, high)]
    return j


def test_with_several_devices_the_undecided_gains_get_their_second_look_too() -> None:
    judge = ScriptedTimings(
        timing(1.09, 0.98, 1.20), timing(1.01, 0.9, 1.1), timing(1.30, 1.2, 1.4), timing(1.12, 1.06, 1.2)
    )
    judge.plan = plan(devices=(0, 1))
    a, b = judged("a").candidate, judged("b").candidate
    verdicts = judge_batch(judge, [a, b], incumbent(), GAIN, dropped, dropped)
    assert judge.calls == 3  # a twice (undecided, then crowned), b once (decided not better)
    assert [v.outcome for v in verdicts] == [Outcome.BETTER, Outcome.OK]
    assert any("second look" in n for n in verdicts[0].notes)


def test_with_several_devices_a_gain_undecided_twice_stays_ok_with_one_note() -> None:
    judge = ScriptedTimings(timing(1.09, 0.98, 1.20), timing(1.08, 0.97, 1.19))
    judge.plan = plan(devices=(0, 1))
    (verdict,) = judge_batch(judge, [judged("a").candidate], incumbent(), GAIN, dropped, dropped)
    assert judge.calls == 2 and verdict.outcome == Outcome.OK
    assert sum("second look" in n for n in verdict.notes) == 1


class Verifying(ScriptedTimings):
    """The judge as a winner's verification uses it: the baseline re-recorded, then fresh processes."""

    def baseline(self, candidate: Candidate) -> Judged:
        return Judged(candidate, Outcome.OK)

    def fresh_processes(self) -> None:
        pass


def test_a_marginal_verification_is_timed_again_and_that_timing_decides() -> None:
    base = judged("base")
    lost = Verifying(timing(1.07, 1.02, 1.12), timing(1.01, 0.95, 1.05))
    fresh, why = verify(cast(Any, lost), base, judged("v"), GAIN, dropped)
    assert fresh is None and lost.calls == 2 and "did not hold" in why
    held = Verifying(timing(1.07, 1.02, 1.12), timing(1.08, 1.03, 1.12))
    fresh, _ = verify(cast(Any, held), base, judged("w"), GAIN, dropped)
    assert fresh is not None and held.calls == 2 and any("timed again" in n for n in fresh.notes)
    clear = Verifying(timing(1.5, 1.3, 1.7))
    fresh, _ = verify(cast(Any, clear), base, judged("x"), GAIN, dropped)
    assert fresh is not None and clear.calls == 1
