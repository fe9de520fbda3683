"""A verified winner committed to `kope/<op>` (the toolchain has baked the winning values into the
source; review/publish.py and review/vcs.py commit and push it), and the operator summed up for the
report, once, from what its loop decided.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..review import report
from ..review.publish import VerifiedWinner
from ..review.summary import MachineBusy, OperatorSummary, Published, TimedRtol, Winner
from ..spec import FLAGS
from ..toolchains.flagblock import describe
from .progress import Progress
from .verify import Checked, Operand

if TYPE_CHECKING:
    from ..judge.outcome import Judged
    from ..operator import Operator
    from .run import Run


def commit_winner(s: Run, o: Operand, p: Progress, checked: Checked) -> tuple[Winner, str]:
    """Where the verified winner went (its branch and commit, else its file) and the note for the
    report; an empty `Winner` and the verification's note when nothing was verified."""
    winner, verified, note = Winner(), checked.verified, checked.note
    if verified is None:
        return winner, note
    earlier = s.graph.last_committed(o.task)  # before this run commits it
    s.publisher.measure_peers(o.op, checked.baked, s.children)  # --kope-peers, before the PR body
    if s.vcs is not None:
        made = VerifiedWinner(o.op, verified, p.baseline, p.history, o.hw)
        winner.branch, winner.commit, note = s.publisher.commit(made, o.plan.files, checked.baked)
        if winner.branch and winner.commit:
            s.graph.mark_committed(o.task, verified.candidate.hash, winner.branch, winner.commit)
    else:
        note = f"verified, not committed: {s.no_commit_why}"
    if winner.branch is None:  # on no branch: the file a commit would hold
        winner.file = str(_keep(s, o.op, checked.baked))
        note += f"; the winner's file (its values baked in) is {winner.file}"
    if earlier and earlier["candidate_hash"] == verified.candidate.hash:
        # an earlier run's winner, verified again: not a new winner, whatever its branch gets now
        winner.already_committed = {"branch": earlier.get("branch"), "commit": earlier.get("commit")}
    return winner, note


def summed_up(
    s: Run, o: Operand, p: Progress, checked: Checked, winner: Winner, note: str, decided: dict[str, Any]
) -> OperatorSummary:
    """The operator's summary, made once: the search, the verification, where the winner went, and
    what the loop `decided` (why it stopped, its flaky tests, ...); the note is said too."""
    verified, plain, held = checked.verified, checked.plain, checked.baseline_isa
    rtol, rtol_from = o.judge.timed_rtol
    timed_rtol: TimedRtol = {"rtol": rtol, "from": rtol_from}
    in_source = None
    if verified is not None:  # a kernel the repo builds itself: how its flags went into the source
        in_source = describe(o.op.build_context(o.op.spec), str(verified.candidate.params.get(FLAGS, ""))) or None
    summary = report.operator_summary(
        op=o.op,
        search=p.searched(),
        verified=verified,
        winner=winner,
        note=note,
        seconds_spent=time.monotonic() - o.started,  # verification included
        timed_rtol=timed_rtol,
        plain_pytest=plain.to_json() if plain else None,
        baseline_isa=held.to_json() if held else None,
        flags_in_source=in_source,
        machine_busy=_machine_busy([*p.history, *([verified] if verified else [])]),
        **decided,
    )
    # publish.py's contract is a dict: it reads the entry's candidates and hands back its own keys
    summary = replace(summary, published=Published.from_json(s.publisher.after(o.op.name, summary.to_json())))
    if note:
        o.say(note)
    return summary


def _keep(s: Run, op: Operator, baked: str) -> Path:
    """The winner's file where no branch holds it: `.kope/runs/<run-id>/<operator>/<source name>`."""
    kept = s.run_dir / op.name / Path(op.source).name
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(baked)
    return kept


def _machine_busy(judged: list[Judged]) -> MachineBusy | None:
    """How much of the machine others used during the operator's timings (`judge/measure/contention.py`)."""
    seen = sorted(t.busy for j in judged for t in j.timings if t.busy is not None)
    if not seen:
        return None
    return {"median": round(seen[len(seen) // 2], 3), "max": round(seen[-1], 3), "timings": len(seen)}
