"""The end of a search: the incumbent verified as the file a merge delivers, in fresh processes with
fresh inputs against the committed kernel (`verify_incumbent`), and when it is found wrong there, the
runner-up in its place. What the search decided (decide.py) is taken back here if it does not hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..candidate import Candidate
from ..judge.controller import plaincheck
from ..judge.controller.plan import Plan
from ..judge.controller.runner import Judge
from ..judge.measure.contention import CONTENDED
from ..judge.outcome import Judged, Outcome
from ..toolchains.flagblock import BASELINE_ENV, BASELINE_FLAGS, carried, has_clones
from .decide import beats, within_placement
from .progress import Progress

if TYPE_CHECKING:
    from ..judge.controller.plaincheck import PlainRun
    from ..operator import Operator
    from ..toolchains.base import Toolchain
    from .run import Run

TIMINGS = 3  # a winner's verification is timed at most this often, for one timing on a quiet machine
FALLBACKS = 2  # runners-up verified at most, when winners are found incorrect in verification


@dataclass(frozen=True)
class Operand:
    """One operator as verifying and committing its winner see it: made once by its loop."""

    op: Operator
    task: int
    judge: Judge
    plan: Plan
    tc: Toolchain
    hw: dict[str, Any]
    say: Callable[[str], None]  # a line of the run's output, prefixed with the operator
    fault: Callable[[Judged], None]  # a judgement lost to the machinery
    started: float  # time.monotonic() when the operator started: its summary's seconds


@dataclass
class Checked:
    """What verifying the incumbent as the file to commit gave: the verified winner (None: none),
    that file, the note for the report, and the plain pytest run on it (None: it never got that far)."""

    verified: Judged | None
    baked: str = ""
    note: str = ""
    plain: PlainRun | None = None
    baseline_isa: PlainRun | None = None  # the plain run with the instruction set held to the baseline


def verify_incumbent(s: Run, o: Operand, p: Progress) -> Checked:
    """The incumbent verified as the file to commit (the time it took counted in the run's clock);
    `Checked(None, note=why)` when there is nothing to verify or no time left for it."""
    if p.incumbent is p.baseline:
        return Checked(None)
    if not s.clock.can_verify():
        left, takes = max(0.0, s.clock.left()), s.clock.verify_s()
        why = f"the time budget ran out ({left:.0f} s left, verifying takes about {takes:.0f} s)"
        return Checked(None, note=f"not verified: {why}")
    verifying = time.monotonic()
    checked = _verify_or_runner_up(s, o, p)
    s.clock.verifies.append(time.monotonic() - verifying)
    return checked


def _verify_or_runner_up(s: Run, o: Operand, p: Progress) -> Checked:
    """`_verify_committed`; when the winner is found wrong on inputs it had never seen (drawn calls
    land in a narrow band of a cheat only in some runs), the runner-up is verified in its place."""
    checked = _verify_committed(s, o, p)
    for _ in range(FALLBACKS):
        if checked.verified is not None or (runner_up := _runner_up(p, s.settings.min_gain)) is None:
            break
        o.say(f"{checked.note[:200]}; verifying the runner-up {runner_up.candidate.short} instead")
        p.incumbent = runner_up
        plain = checked.plain
        checked = _verify_committed(s, o, p)
        checked.plain = checked.plain or plain  # the report tells the last plain run there was
    return checked


def _runner_up(p: Progress, min_gain: float) -> Judged | None:
    """After the incumbent was found incorrect in verification (`verify`, the plain check):
    the fastest other candidate judged correct and faster than the baseline, if any."""
    if p.incumbent.outcome.correct:  # it failed on time or on the machinery, not on correctness
        return None
    correct = [
        j
        for j in p.history
        if j is not p.incumbent
        and j.outcome in (Outcome.BETTER, Outcome.OK)
        and (j.speedup or 0.0) > 1.0 + min_gain
    ]
    return max(correct, key=lambda j: j.speedup or 0.0, default=None)


def _verify_committed(s: Run, o: Operand, p: Progress) -> Checked:
    """The incumbent verified as the file to commit. The toolchain writes the winning values into the
    source (`Toolchain.bake`), and that file, the one a merge delivers, is what the fresh processes
    judge and time against the baseline; then the operator's tests run on it as plain `pytest` does."""
    inc = p.incumbent.candidate
    built = carried(inc, o.op.build_context(o.op.spec))  # flags into the file, where the repo builds it
    baked = o.tc.bake(built.source, built.params)
    o.say(f"verifying {inc.short} as the file to commit, in a fresh process against the baseline")
    as_committed = replace(inc, source=baked)
    verified, note = verify(
        o.judge, p.baseline, p.incumbent, s.settings.min_gain, o.fault, as_committed
    )
    if verified is None:
        return Checked(None, note=note)
    for line in verified.notes:  # timed again, or on a busy machine: the reader should know
        if line.startswith("timed "):
            o.say(line)
    verified.candidate = inc  # measured as the committed file; named as the search found it
    top, base = (s.vcs.top, s.vcs.base) if s.vcs else (None, None)
    plain = plaincheck.run(o.plan, o.op.source, baked, top, base)
    o.say(plain.line())
    if not plain.ok:  # judged correct, yet wrong where the user runs it: incorrect
        p.incumbent.outcome = Outcome.INCORRECT
        p.incumbent.failures.insert(0, plain.line())
        return Checked(None, note=f"not committed: {plain.line()}", plain=plain)
    if not has_clones(baked):
        return Checked(verified, baked, note, plain)
    held = plaincheck.run(o.plan, o.op.source, baked, top, base, env={BASELINE_ENV: "1"})
    line = f"with the instruction set held to the baseline ({' '.join(BASELINE_FLAGS)}), {held.line()}"
    o.say(line)
    if not held.ok:  # the fallback a machine without the instruction set runs is wrong
        p.incumbent.outcome = Outcome.INCORRECT
        p.incumbent.failures.insert(0, line)
        return Checked(None, note=f"not committed: {line}", plain=plain, baseline_isa=held)
    return Checked(verified, baked, note, plain, held)


def verify(
    judge: Judge,
    baseline: Judged,
    incumbent: Judged,
    min_gain: float,
    fault: Callable[[Judged], None],
    as_committed: Candidate | None = None,
) -> tuple[Judged | None, str]:
    """Re-run the winner in a fresh process with fresh inputs, timed against the baseline: the verified
    winner (its speedup now its ratio to the baseline), or None and why not (a judgement lost to the
    machinery is not the candidate's failure: `fault` hears of it).

    The committed kernel records the differential check's calls on new seeds first, in a warm child
    (it is trusted code, and the fork server never loads a candidate: a fresh process bought it
    nothing but a second's start); the winner is then judged in fresh processes only. `as_committed`:
    the winner as the file a merge delivers (its values written into the source), judged in its place."""
    judge.baseline(baseline.candidate)  # the differential check on inputs never seen before
    judge.fresh_processes()  # independence over speed: a new process, a new build
    fresh = judge.correctness([as_committed or incumbent.candidate])[0]
    if fresh.outcome.correct:
        _time_uncontended(judge, fresh, baseline.candidate)
        if beats(fresh, min_gain) and within_placement(fresh, min_gain):  # new processes: alone decides
            fresh.notes.append(
                f"timed again: the verification's gain, {fresh.ratio:.2f}x (low {fresh.ratio_low:.2f}), is"
                " within what two processes' placement alone gives"
            )
            _time_uncontended(judge, fresh, baseline.candidate)
    if fresh.fault and not (fresh.outcome.correct and fresh.timings):
        fault(fresh)
        return None, f"not verified: infrastructure fault: {fresh.fault[:300]}"
    if not fresh.outcome.correct:  # wrong on inputs it had never seen: the candidate is not correct
        incumbent.outcome, incumbent.failures = fresh.outcome, fresh.failures
    if not (fresh.outcome.correct and fresh.timings):
        why = (fresh.failures or fresh.notes or [""])[0][:300]
        return None, f"failed verification: {fresh.outcome.value}: {why}"
    if (busy := fresh.busy or 0.0) >= CONTENDED:  # busy in every timing: the gain must outlast the load
        low = (fresh.ratio_low or 0.0) / (1.0 + busy)
        if low <= 1.0 + min_gain:
            return None, (
                f"not verified: others used {busy:.0%} of the machine in each of {TIMINGS} timings, and"
                f" the gain's low bound widened by that share ({low:.2f}x) does not hold"
            )
        fresh.notes.append(
            f"timed on a busy machine (others used {busy:.0%}): held with its low bound / {1 + busy:.2f}"
        )
    if not beats(fresh, min_gain):
        return None, f"gain did not hold on re-run ({fresh.ratio:.2f}x, low {fresh.ratio_low:.2f})"
    before, after = fresh.paired_times or (1.0, 1.0)
    fresh.speedup = before / after  # the times every report shows beside it divide to it
    return fresh, ""


def _time_uncontended(judge: Judge, fresh: Judged, baseline: Candidate) -> None:
    """Time the winner against the baseline until a timing was taken on a quiet machine (others used
    under `CONTENDED` of it), at most `TIMINGS` times: a paired ratio moves with the load (a
    two-thread kernel loses half its speed to a busy neighbour core, a one-thread kernel nothing)."""
    for attempt in range(TIMINGS):
        timed = judge.performance(Judged(fresh.candidate, fresh.outcome), baseline)
        fresh.add_time(timed)
        fresh.outcome, fresh.failures, fresh.fault = timed.outcome, timed.failures, timed.fault
        fresh.timings, fresh.notes = timed.timings, fresh.notes + timed.notes
        if not (timed.outcome.correct and timed.timings) or (timed.busy or 0.0) < CONTENDED:
            return
        if attempt + 1 < TIMINGS:
            fresh.notes.append(f"timed again: others used {timed.busy:.0%} of the machine meanwhile")
