"""The end of one operator: verify the incumbent, commit a verified winner to `kope/<op>` (the
toolchain bakes the winning values into the source, publish.py and vcs.py commit and push it), and
sum the operator up for the report.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import report
from .decide import verify

if TYPE_CHECKING:
    from ..judge.outcome import Judged
    from .loop import OperatorLoop, Progress
    from .session import KopeSession


def conclude(s: KopeSession, loop: OperatorLoop, p: Progress, seconds: float) -> dict[str, Any]:
    """Verify and commit the incumbent (if it is not the baseline); the operator's summary."""
    op = loop.op
    verified: Judged | None = None
    branch = commit = None
    note = ""
    if p.incumbent is not p.baseline and not s.clock.can_verify():
        note = (
            f"not verified: the time budget ran out ({max(0.0, s.clock.left()):.0f} s left, "
            f"verifying takes about {s.clock.verify_s():.0f} s)"
        )
    elif p.incumbent is not p.baseline:
        started = time.monotonic()
        loop.say(f"verifying {p.incumbent.candidate.short} in a fresh process against the baseline")
        verified, note = verify(loop.judge, p.baseline, p.incumbent, s.settings.min_gain, loop.fault)
        s.clock.verifies.append(time.monotonic() - started)
        # the toolchain writes the winning values in as the defaults, so the committed file builds the
        # winner; publish.py commits it (never losing a commit), pushes, opens the pull request
        baked = loop.tc.bake(verified.candidate.source, verified.candidate.params) if verified else ""
        if verified is not None:
            s.publisher.measure_peers(op, baked)  # --kope-peers, before the PR body is written
        if verified is not None and s.vcs is not None:
            branch, commit, note = s.publisher.commit(
                op, verified, p.baseline, p.history, loop.hw, loop.plan.files, baked
            )
        elif verified is not None:
            note = f"verified, not committed: {s.no_commit_why}"
    summary = report.operator_summary(
        op,
        p.baseline,
        verified or p.incumbent,
        verified is not None,
        p.rule.evaluations,
        p.best_at,
        p.history,
        branch,
        commit,
        note,
        seconds,
    )
    summary.update(s.publisher.after(op.name, summary))
    if note:
        loop.say(note)
    return summary
