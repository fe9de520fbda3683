"""What one optimize run hands each operator's loop, the commit step and doctor: a typed `Run`, made
once when the run has opened its store, instead of the pytest plugin object itself (whose other
attributes are pytest's business). Under `--kope-concurrency` an operator gets a copy with its own
agent (`dataclasses.replace`); nothing else differs between operators."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..operator import Operator
from ..review.summary import OperatorSummary
from ..settings import Settings
from ..stopping import RunClock

if TYPE_CHECKING:
    from ..agents.base import Agent
    from ..judge.controller.sandbox import Children
    from ..memory import Graph
    from ..review.publish import Publisher
    from ..review.vcs import Vcs
    from .ceilings import CeilingProbe
    from .concurrency import Concurrency


@dataclass
class OperatorRun:
    """One operator of the run: its collected test items, then its summary for the report."""

    op: Operator
    items: list[pytest.Item]
    summary: OperatorSummary | None = None  # None until the operator ended, or was kept from starting
    told: bool = False  # pytest_kope_operator_done was called with its summary


@dataclass(frozen=True)
class Run:
    """The run as its operators see it: settings, clock, store, git, publisher, agent and terminal."""

    config: pytest.Config
    run_id: str
    settings: Settings
    clock: RunClock
    home: Path  # the repo's root, where `.kope/` lives
    kope_base: Path  # `.kope/`
    run_dir: Path  # `.kope/runs/<run-id>/`
    graph: Graph
    vcs: Vcs | None
    no_commit_why: str  # why winners are not committed here ("" when they are)
    publisher: Publisher
    agent: Agent
    concurrency: Concurrency  # the executor, shared timing slots, infrastructure faults
    ceilings: CeilingProbe  # this machine's measured ceilings, probed once a run
    children: Children  # every child the run started and has not killed: what an interruption kills
    say: Callable[..., None]  # one whole line to the terminal (`red=True` for trouble)

    def batch(self) -> int:
        """Candidates per round: enough to keep every correctness worker busy twice."""
        return max(2, self.settings.jobs * 2)
