"""When an operator's search stops, and why: a budget is a cap, not a quota.

`StopRule` decides, before each batch, how many candidates the next batch may hold (0: stop) and
records why the search ended: the evaluation budget is spent, N successive evaluations brought no
gain (`--kope-patience`), the agent has converged or has nothing more to propose, or the operator's
share of the run's time (`--kope-time-budget`) is used up.

`RunClock` shares a run's time budget among its operators: each gets the time left divided by the
operators left, but at least what one operator needs to reach a verified winner (its baseline, one
batch and a verification, as measured so far in this run); an operator for which not even that is
left is not started. Within its slot an operator stops proposing while there is still time to verify
its incumbent; its first round, and the verification, may use any time the run has left.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Stop(str, Enum):
    """Why an operator's search ended (report.json's `stopped.reason`)."""

    BUDGET = "budget"  # the evaluation budget is spent
    NO_GAIN = "no_gain"  # N successive evaluations brought no gain
    CONVERGED = "converged"  # every untried point is predicted worse, or every point was tried
    AGENT_DONE = "agent_done"  # the agent had nothing more to propose
    TIME = "time"  # the operator's share of the run's time budget is used up
    NOT_TIMED = "not_timed"  # nothing to time (no performance test, or no timer here): no search
    NOT_REACHED = "not_reached"  # the run's time budget ran out before this operator began
    ERROR = "error"  # the operator stopped on an error (broken baseline, missing toolchain)
    INTERRUPTED = "interrupted"  # the run was interrupted (Ctrl-C, SIGTERM) before this operator ended


SHORT = {
    Stop.BUDGET: "budget spent",
    Stop.NO_GAIN: "no gain in {n}",
    Stop.CONVERGED: "converged",
    Stop.AGENT_DONE: "agent done",
    Stop.TIME: "time budget",
    Stop.NOT_TIMED: "not timed",
    Stop.NOT_REACHED: "not reached",
    Stop.ERROR: "error",
    Stop.INTERRUPTED: "interrupted",
}

# Before anything is measured in this run: what an operator's baseline, and one evaluation, take here.
FIRST_GUESS_S = 15.0
VERIFY_FACTOR = 1.5  # a verification re-records the baseline's calls, then tests and times the winner


def stopped(reason: Stop, detail: str = "", n: int = 0) -> dict[str, Any]:
    """The `stopped` entry of an operator's summary: a reason code, a short and a full text."""
    short = SHORT[reason].format(n=n)
    return {"reason": reason.value, "short": short, "detail": detail or short}


@dataclass
class Slot:
    """One operator's share of the run's time: its deadline and what the clock has measured."""

    clock: RunClock
    deadline: float

    def evaluations_that_fit(self, first_round: bool = False) -> int:
        """How many more evaluations fit before the deadline, leaving time to verify. An operator's
        first round may use the run's time beyond its own share: its baseline is paid for, and one
        round and a verification are the cheapest way to a verified winner left in the run."""
        deadline = self.clock.now() + self.clock.left() if first_round else self.deadline
        spare = deadline - self.clock.now() - self.clock.verify_s()
        return max(0, math.floor(spare / self.clock.eval_s())) if spare > 0 else 0

    def propose_by(self, n: int) -> float:
        """When a round of `n` candidates must be proposed (an agent's model calls end by then), so
        that judging them and verifying a winner still fit in the operator's share. Unlike the
        evaluations, a first round gets no more than the share: one slow model round (minutes on a
        CPU server) must not take the time of the operators after it."""
        return self.deadline - self.clock.verify_s() - n * self.clock.eval_s()


@dataclass
class RunClock:
    """The whole run's time budget (None: no limit) and the costs measured so far."""

    minutes: float | None
    now: Callable[[], float] = time.monotonic
    start: float = field(default=-1.0)
    baselines: list[float] = field(default_factory=list)  # seconds per baseline (plan, test, time)
    evaluations: list[tuple[int, float]] = field(default_factory=list)  # (candidates, seconds) per batch
    verifies: list[float] = field(default_factory=list)  # seconds per verification

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.now()

    @property
    def limited(self) -> bool:
        return self.minutes is not None

    def left(self) -> float:
        if self.minutes is None:
            return math.inf
        return self.start + self.minutes * 60.0 - self.now()

    def baseline_s(self) -> float:
        return sum(self.baselines) / len(self.baselines) if self.baselines else FIRST_GUESS_S

    def eval_s(self) -> float:
        n = sum(k for k, _ in self.evaluations)
        return sum(s for _, s in self.evaluations) / n if n else self.baseline_s()

    def verify_s(self) -> float:
        if self.verifies:
            return sum(self.verifies) / len(self.verifies)
        return VERIFY_FACTOR * self.baseline_s()

    def need_s(self, batch: int) -> float:
        """What one operator needs for a verified winner: a baseline, one batch and a verification."""
        return self.baseline_s() + batch * self.eval_s() + self.verify_s()

    def slot(self, operators_left: int, batch: int) -> Slot | None:
        """The next operator's share (a limited clock), or None when the run's time cannot cover even
        its minimum."""
        left = self.left()
        need = self.need_s(batch)
        if left < need and (self.baselines or left <= 0):  # the first operator starts on a guess
            return None
        return Slot(self, self.now() + min(left, max(left / max(1, operators_left), need)))

    def can_verify(self) -> bool:
        return self.left() >= self.verify_s()


@dataclass
class StopRule:
    """Per operator: how big the next batch may be, and why the search ended."""

    budget: int
    patience: int  # successive evaluations without a gain that end the search; 0: never
    slot: Slot | None = None
    evaluations: int = 0
    streak: int = 0  # evaluations since the last gain
    why: dict[str, Any] | None = None
    # the axes no evidence speaks for that the agent has not tried around its incumbent
    # (agents/tuner/exploration.py): while there are any, patience waits
    unexplored: Callable[[], list[str]] = field(default=lambda: [])
    waited: bool = False  # patience was reached once with axes still unexplored

    def room(self, batch: int) -> int:
        """Candidates the next batch may hold; 0 means stop (and `why` says why)."""
        if self.why is not None:
            return 0
        left = self.budget - self.evaluations
        if left <= 0:
            return self.stop(Stop.BUDGET, f"the budget of {self.budget} evaluations is spent")
        n = min(batch, left)
        if self.patience and self.streak < self.patience:
            n = min(n, self.patience - self.streak)  # stop at exactly N
        elif self.patience:
            waiting = self.unexplored()
            if not waiting:
                return self.stop(Stop.NO_GAIN, self._no_gain(), self.streak)
            self.waited = True
            n = min(n, len(waiting))  # one probe an unexplored axis: look again after them
        if self.slot is not None:
            fits = self.slot.evaluations_that_fit(first_round=self.evaluations == 0)
            if fits < 1:
                return self.stop(Stop.TIME, "its share of --kope-time-budget is used up")
            n = min(n, fits)
        return n

    def _no_gain(self) -> str:
        said = f"no gain in the last {self.streak} evaluations (--kope-patience {self.patience})"
        if self.waited:
            said += (
                "; it went on until every axis nothing in the graph spoke for was tried around the incumbent"
            )
        return said

    def record(self, gained: list[bool], seconds: float) -> None:
        """A judged batch: whether each candidate was a gain, and the batch's wall time."""
        for gain in gained:
            self.evaluations += 1
            self.streak = 0 if gain else self.streak + 1
        if self.slot is not None and gained:
            self.slot.clock.evaluations.append((len(gained), seconds))

    def stop(self, reason: Stop, detail: str = "", n: int = 0) -> int:
        if self.why is None:
            self.why = stopped(reason, detail, n)
        return 0
