"""Ctrl-C and SIGTERM during an optimize run: the one place an interruption is handled.

The first signal ends the judgements in progress: every judging child and fork server is killed
(`Children.stop_all`), and a judgement that waited on one raises `Interrupted` instead of handing back a
verdict. It also ends the agents' work in flight (`also`: the session's agents' `cancel`): a model
call is closed at once and no further call or round starts. Each operator's loop closes its judge on
the way out (fork servers, build cache, recorded calls: the run's /tmp/kope-* folders); each
operator not finished gets a summary whose `stopped` says
`interrupted`; the session writes the report, prints its table and exits with status 2 (pytest's
"interrupted"). Every verdict finished before the signal is in the graph already (each is recorded in
one transaction as it comes), so the next run resumes from them.

The first signal raises nothing into the main thread: it finishes the step it is in (a graph write, a
git commit, an agent's request) and stops where it next starts or waits for a child. A second signal
raises KeyboardInterrupt at once, wherever the run is (pytest's own Ctrl-C); a graph write in progress
is then rolled back (`memory.rows.writing`), so the graph holds whole verdicts only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..judge.controller import sandbox
from ..review import report
from ..review.summary import OperatorSummary, Winner
from ..stopping import Stop, stopped

if TYPE_CHECKING:
    from .loop import OperatorLoop
    from .run import OperatorRun

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interruption:
    """SIGINT and SIGTERM, from `with` (in the main thread) until `close()`: during the run they stop
    it as above; once it has ended (its report written, its graph closed) a signal quits at once, so
    pytest's closing lines never end in a traceback. `why` names the signal ("" while none came)."""

    def __init__(self, tw: Any, children: sandbox.Children):
        self.tw = tw  # pytest's terminal reporter, or None
        self.children = children  # the run's: every child it started and has not killed, killed on a signal
        self.why = ""
        self.ended = False
        self.began = time.monotonic()
        self.at = 0.0
        self.also: list[Any] = []  # called with the signal's name on the first signal (agents' cancel)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interruption:
        self.children.allow_starts()  # a run before this one in the same process may have been interrupted
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._signalled)
        return self

    def __exit__(self, *exc: object) -> None:
        self.ended = True

    def close(self) -> None:
        """The handlers there were before (pytest's, or a pytester run's caller's)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.ended:
            self._say(f"kope: {name}: quitting")
            sys.stdout.flush()
            os._exit(2)
        if self.why:
            self.ended = True
            self._say(f"kope: {name} again: quitting at once; the report is not written")
            raise KeyboardInterrupt
        self.why, self.at = name, time.monotonic()
        self._say(
            f"kope: {name}: stopping: the judgements and the model call in progress end, then the report"
            " is written (Ctrl-C again quits at once)"
        )
        self.children.stop_all()
        for cancel in self.also:
            try:
                cancel(name)
            except Exception:  # noqa: BLE001 - one agent's failure to stop must not stop the others
                pass

    def _say(self, line: str) -> None:
        """Straight to the terminal: the session's output lock may be held by the interrupted frame."""
        if self.tw is not None:
            self.tw.write_line(line, red=True)
        else:
            print(line, file=sys.stderr)

    def ending(self) -> str:
        """pytest's closing 'stopped' line for an interrupted run."""
        return (
            f"kope: interrupted by {self.why} after {self.at - self.began:.0f} s: every finished verdict "
            "is recorded; the next run resumes from them"
        )


def interrupted_summary(name: str, loop: OperatorLoop | None) -> OperatorSummary:
    """The report's entry for an operator the interruption found unfinished: its search so far, its
    best not verified, or only that it stopped before its baseline was judged."""
    p = loop.progress if loop is not None else None
    if loop is None or p is None:
        why = "interrupted before its baseline was judged"
        return OperatorSummary(name=name, verified=False, stopped=stopped(Stop.INTERRUPTED, why))
    seconds = time.monotonic() - loop.started
    note = "interrupted: the best so far is not verified; the next run resumes from it"
    return report.operator_summary(
        op=loop.op,
        search=p.searched(),
        verified=None,
        winner=Winner(),
        note=note,
        seconds_spent=seconds,
        flaky_tests=loop.flaky,
        stopped=stopped(Stop.INTERRUPTED, f"interrupted after {p.rule.evaluations} evaluation(s)"),
    )


def not_started(runs: list[OperatorRun]) -> None:
    """Operators the interruption kept from starting: said so in their summaries."""
    for run in runs:
        if run.summary is None:
            why = "not started: the run was interrupted"
            run.summary = OperatorSummary(
                name=run.op.name, verified=False, stopped=stopped(Stop.INTERRUPTED, why)
            )
