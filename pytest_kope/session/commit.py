"""The end of one operator: verify the incumbent, commit a verified winner to `kope/<op>` (the
toolchain bakes the winning values into the source, review/publish.py and review/vcs.py commit and push
it), and sum the operator up for the report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..judge.controller import plaincheck
from ..judge.outcome import Outcome
from ..review import report
from ..review.publish import VerifiedWinner
from ..review.summary import MachineBusy, OperatorSummary, Published, TimedRtol, Winner
from ..spec import FLAGS
from ..toolchains.flagblock import BASELINE_ENV, BASELINE_FLAGS, carried, describe, has_clones
from .decide import verify
from .progress import Progress

FALLBACKS = 2  # runners-up verified at most, when winners are found incorrect in verification

if TYPE_CHECKING:
    from ..judge.controller.plaincheck import PlainRun
    from ..judge.controller.plan import Plan
    from ..judge.controller.runner import Judge
    from ..judge.outcome import Judged
    from ..operator import Operator
    from ..toolchains.base import Toolchain
    from .run import Run


class Operand(Protocol):
    """What the end of an operator needs of its loop (`loop.OperatorLoop`), and no more."""

    op: Operator
    task: int
    judge: Judge
    plan: Plan
    tc: Toolchain
    hw: dict[str, Any]

    def say(self, line: str, red: bool = False) -> None: ...

    def fault(self, j: Judged) -> None: ...


@dataclass
class Checked:
    """What verifying the incumbent as the file to commit gave: the verified winner (None: none),
    that file, the note for the report, and the plain pytest run on it (None: it never got that far)."""

    verified: Judged | None
    baked: str = ""
    note: str = ""
    plain: PlainRun | None = None
    baseline_isa: PlainRun | None = None  # the plain run with the instruction set held to the baseline


def conclude(s: Run, loop: Operand, p: Progress, started: float, decided: dict[str, Any]) -> OperatorSummary:
    """Verify and commit the incumbent (if it is not the baseline); the operator's summary, made once
    with what the loop `decided` (why it stopped, its flaky tests, ...) and the time since `started`."""
    op = loop.op
    verified: Judged | None = None
    winner = Winner()
    note = ""
    earlier = s.graph.last_committed(loop.task)  # before this run commits anything
    rtol, rtol_from = loop.judge.timed_rtol
    timed_rtol: TimedRtol = {"rtol": rtol, "from": rtol_from}
    plain: PlainRun | None = None  # the last plain pytest run on a file to commit
    baseline_isa: PlainRun | None = None  # and the one with the instruction set held to the baseline
    if p.incumbent is not p.baseline and not s.clock.can_verify():
        note = (
            f"not verified: the time budget ran out ({max(0.0, s.clock.left()):.0f} s left, "
            f"verifying takes about {s.clock.verify_s():.0f} s)"
        )
    elif p.incumbent is not p.baseline:
        verifying = time.monotonic()
        checked = _verify_or_runner_up(s, loop, p)
        verified, baked, note, plain = checked.verified, checked.baked, checked.note, checked.plain
        baseline_isa = checked.baseline_isa
        s.clock.verifies.append(time.monotonic() - verifying)
        if verified is not None:
            s.publisher.measure_peers(op, baked, s.children)  # --kope-peers, before the PR body is written
        if verified is not None and s.vcs is not None:
            made = VerifiedWinner(op, verified, p.baseline, p.history, loop.hw)
            winner.branch, winner.commit, note = s.publisher.commit(made, loop.plan.files, baked)
            if winner.branch and winner.commit:
                s.graph.mark_committed(loop.task, verified.candidate.hash, winner.branch, winner.commit)
        elif verified is not None:
            note = f"verified, not committed: {s.no_commit_why}"
        if verified is not None and winner.branch is None:  # on no branch: the file a commit would hold
            winner.file = str(_keep(s, op, baked))
            note += f"; the winner's file (its values baked in) is {winner.file}"
    if verified is not None and earlier and earlier["candidate_hash"] == verified.candidate.hash:
        # an earlier run's winner, verified again: not a new winner, whatever its branch gets now
        winner.already_committed = {"branch": earlier.get("branch"), "commit": earlier.get("commit")}
    in_source = None
    if verified is not None:  # a kernel the repo builds itself: how its flags went into the source
        in_source = describe(op.build_context(op.spec), str(verified.candidate.params.get(FLAGS, ""))) or None
    summary = report.operator_summary(
        op=op,
        search=p.searched(),
        verified=verified,
        winner=winner,
        note=note,
        seconds_spent=time.monotonic() - started,  # verification included
        timed_rtol=timed_rtol,
        plain_pytest=plain.to_json() if plain else None,
        baseline_isa=baseline_isa.to_json() if baseline_isa else None,
        flags_in_source=in_source,
        machine_busy=_machine_busy([*p.history, *([verified] if verified else [])]),
        **decided,
    )
    # publish.py's contract is a dict: it reads the entry's candidates and hands back its own keys
    summary = replace(summary, published=Published.from_json(s.publisher.after(op.name, summary.to_json())))
    if note:
        loop.say(note)
    return summary


def _keep(s: Run, op: Operator, baked: str) -> Path:
    """The winner's file where no branch holds it: `.kope/runs/<run-id>/<operator>/<source name>`."""
    kept = s.run_dir / op.name / Path(op.source).name
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(baked)
    return kept


def _verify_committed(s: Run, loop: Operand, p: Progress) -> Checked:
    """The incumbent verified as the file to commit. The toolchain writes the winning values into the
    source (`Toolchain.bake`), and that file, the one a merge delivers, is what the fresh processes
    judge and time against the baseline; then the operator's tests run on it as plain `pytest` does."""
    inc = p.incumbent.candidate
    built = carried(inc, loop.op.build_context(loop.op.spec))  # flags into the file, where the repo builds it
    baked = loop.tc.bake(built.source, built.params)
    loop.say(f"verifying {inc.short} as the file to commit, in a fresh process against the baseline")
    as_committed = replace(inc, source=baked)
    verified, note = verify(
        loop.judge, p.baseline, p.incumbent, s.settings.min_gain, loop.fault, as_committed
    )
    if verified is None:
        return Checked(None, note=note)
    for line in verified.notes:  # timed again, or on a busy machine: the reader should know
        if line.startswith("timed "):
            loop.say(line)
    verified.candidate = inc  # measured as the committed file; named as the search found it
    top, base = (s.vcs.top, s.vcs.base) if s.vcs else (None, None)
    plain = plaincheck.run(loop.plan, loop.op.source, baked, top, base)
    loop.say(plain.line())
    if not plain.ok:  # judged correct, yet wrong where the user runs it: incorrect
        p.incumbent.outcome = Outcome.INCORRECT
        p.incumbent.failures.insert(0, plain.line())
        return Checked(None, note=f"not committed: {plain.line()}", plain=plain)
    if not has_clones(baked):
        return Checked(verified, baked, note, plain)
    held = plaincheck.run(loop.plan, loop.op.source, baked, top, base, env={BASELINE_ENV: "1"})
    line = f"with the instruction set held to the baseline ({' '.join(BASELINE_FLAGS)}), {held.line()}"
    loop.say(line)
    if not held.ok:  # the fallback a machine without the instruction set runs is wrong
        p.incumbent.outcome = Outcome.INCORRECT
        p.incumbent.failures.insert(0, line)
        return Checked(None, note=f"not committed: {line}", plain=plain, baseline_isa=held)
    return Checked(verified, baked, note, plain, held)


def _machine_busy(judged: list[Judged]) -> MachineBusy | None:
    """How much of the machine others used during the operator's timings (`judge/measure/contention.py`)."""
    seen = sorted(t.busy for j in judged for t in j.timings if t.busy is not None)
    if not seen:
        return None
    return {"median": round(seen[len(seen) // 2], 3), "max": round(seen[-1], 3), "timings": len(seen)}


def _verify_or_runner_up(s: Run, loop: Operand, p: Progress) -> Checked:
    """`_verify_committed`; when the winner is found wrong on inputs it had never seen (drawn calls
    land in a narrow band of a cheat only in some runs), the runner-up is verified in its place."""
    checked = _verify_committed(s, loop, p)
    for _ in range(FALLBACKS):
        if checked.verified is not None or (runner_up := _runner_up(p, s.settings.min_gain)) is None:
            break
        loop.say(f"{checked.note[:200]}; verifying the runner-up {runner_up.candidate.short} instead")
        p.incumbent = runner_up
        plain = checked.plain
        checked = _verify_committed(s, loop, p)
        checked.plain = checked.plain or plain  # the report tells the last plain run there was
    return checked


def _runner_up(p: Progress, min_gain: float) -> Judged | None:
    """After the incumbent was found incorrect in verification (`decide.verify`, the plain check):
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
