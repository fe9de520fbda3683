"""One operator's search so far (the incumbent, its history, the stop rule): what resuming, the search
loop and the commit step share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..judge.outcome import Judged, Outcome
from ..review.summary import Searched
from ..stopping import StopRule


@dataclass
class Progress:
    """One operator's search so far: what resuming and the search loop update."""

    baseline: Judged
    rule: StopRule
    incumbent: Judged = field(init=False)  # the baseline until something beats it
    history: list[Judged] = field(default_factory=list)
    best_at: int = 0  # the evaluation that found the incumbent
    started: float = field(default_factory=time.monotonic)  # for the evaluations per minute

    def __post_init__(self) -> None:
        self.incumbent = self.baseline

    def judged(self, batch: list[Judged], seconds: float) -> None:
        """A judged batch: the stop rule counts it; a candidate crowned BETTER is the new incumbent."""
        self.rule.record([j.outcome == Outcome.BETTER for j in batch], seconds)
        for i, j in enumerate(batch, self.rule.evaluations - len(batch) + 1):
            self.history.append(j)
            if j.outcome == Outcome.BETTER:
                self.incumbent, self.best_at = j, i

    def searched(self) -> Searched:
        """The search so far as the operator's summary tells it."""
        return Searched(self.baseline, self.incumbent, self.history, self.rule.evaluations, self.best_at)
