"""The search without the judge: an evaluator seam, a cached timing table behind it, and the loop.

The optimize loop judges proposals live (workflow.py: correctness, then paired timing against the
incumbent). Anything else that answers `Evaluator.evaluate` can stand in for it: `TableEvaluator`
answers from a table of timings measured once for every point of a space (bench/tables.py), so a
search can be replayed many times, with many seeds, without compiling and without timing noise
(bench/search.py), and an agent can be tested on a small table.

`run_search` is the loop's propose/judge/observe cycle for one operator, with the same bookkeeping
the live loop keeps: `Judged.speedup` against the committed kernel, the incumbent crowned when a
verdict beats it by more than `min_gain`, every verdict recorded in the experience graph (when one
is given) and distilled into lessons after each round.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ...candidate import Candidate
from ...judge.outcome import Judged, Outcome, Timing
from ...memory import distill, recall_from
from ...memory.recall import RecallQuery
from ...settings import DEFAULTS
from ...spec import Point, Scalar, as_point, parse_spec
from ...stopping import StopRule
from ..base import Agent, Context, OperatorInfo
from .exploration import point_key

if TYPE_CHECKING:
    from ...memory.graph import Graph

MIN_GAIN: float = DEFAULTS["kope_min_gain"]


class Evaluator(Protocol):
    """Who judges a search's proposals: the live judge, or a cached table (bench, tests)."""

    def evaluate(self, candidates: list[Candidate], incumbent: Judged) -> list[Judged]:
        """Verdicts on `candidates`, in order: outcome, and for a correct one its timing against
        `incumbent` (`Judged.ratio`) and `Judged.speedup` against the committed kernel."""


@dataclass
class Table:
    """A cached table: each measured point's outcome and speedup over the committed kernel."""

    operator: str
    family: str
    header: str  # the `kope:` lines of the committed source: its kernels and tuning space
    hardware: dict[str, Any]
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # point_key -> row (params: a Point)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        """A table as bench/tables.py stores it; each row's params are checked into a Point here."""
        rows: dict[str, dict[str, Any]] = {}
        for r in data["points"]:
            point = as_point(r["params"])
            rows[point_key(point)] = {**r, "params": point}
        return cls(
            data["operator"], data.get("family", ""), data["header"], dict(data["hardware"]), pooled(rows)
        )

    def info(self) -> OperatorInfo:
        spec = parse_spec(self.header, f"{self.operator}.c")
        return OperatorInfo(
            self.operator, self.family, "c", f"{self.operator}.c", self.header, spec.space, spec.kernels
        )

    def speedup(self, point: Mapping[str, Scalar]) -> float | None:
        """The point's measured speedup over the committed kernel (None: broken or not measured)."""
        row = self.rows.get(point_key(point))
        return float(row["ratio"]) if row and row.get("ratio") else None

    def best(self) -> float:
        return max((float(r["ratio"]) for r in self.rows.values() if r.get("ratio")), default=1.0)

    def points(self) -> list[Point]:
        return [dict(r["params"]) for r in self.rows.values()]


def pooled(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each measured point's speedup as one committed time over its own time.

    Every point was paired with the same committed kernel, so its own time ranks it; its ratio also
    carries that pairing's view of the committed kernel, which is noise when the kernel is slow
    (sgemm's takes 1.5 s a call, and one point's three ratios spread from 47x to 87x). The committed
    time is the median over the points of ratio x seconds; `measured_ratio` keeps what was measured.
    Rows without their own time keep their ratios. Pooling a pooled table changes nothing (it starts
    from `measured_ratio`), so a table stored pooled loads with the very ratios it holds."""
    measured = [r for r in rows.values() if r.get("ratio")]
    if not measured or not all(r.get("seconds") for r in measured):
        return rows
    for r in measured:
        r.setdefault("measured_ratio", r["ratio"])
    committed = statistics.median(float(r["measured_ratio"]) * float(r["seconds"]) for r in measured)
    for r in measured:
        r["ratio"] = committed / float(r["seconds"])
    return rows


class TableEvaluator:
    """Answers from a table; a point the table lacks is rejected (never guessed)."""

    def __init__(self, table: Table, min_gain: float = MIN_GAIN):
        self.table = table
        self.min_gain = min_gain
        self.evaluations = 0

    def evaluate(self, candidates: list[Candidate], incumbent: Judged) -> list[Judged]:
        out = []
        for cand in candidates:
            self.evaluations += 1
            row = self.table.rows.get(point_key(cand.params))
            if row is None:
                out.append(Judged(cand, Outcome.REJECTED, failures=["not in the table"]))
                continue
            speedup = row.get("ratio")
            if not speedup:
                reason = row.get("failure") or row.get("outcome", "")
                outcome = (
                    Outcome(row.get("outcome")) if row.get("outcome") in Outcome._value2member_map_ else None
                )
                out.append(Judged(cand, outcome or Outcome.INCORRECT, failures=[str(reason)]))
                continue
            ratio = float(speedup) / (incumbent.speedup or 1.0)
            timing = Timing("table", 1.0, 1.0 / ratio, ratio, ratio, ratio, 1)
            better = ratio > 1.0 + self.min_gain
            judged = Judged(cand, Outcome.BETTER if better else Outcome.OK, timings=[timing])
            judged.speedup = float(speedup)
            if better:
                incumbent = judged
            out.append(judged)
        return out


def baseline_of(info: OperatorInfo) -> Judged:
    """The committed kernel as the search's first verdict (speedup 1 by definition)."""
    cand = Candidate(
        info.source, info.filename, info.toolchain, dict(info.space.defaults), "committed kernel", "baseline"
    )
    return Judged(cand, Outcome.OK, speedup=1.0)


@dataclass(frozen=True)
class Memory:
    """Where a search records its verdicts and distills its lessons, as a run of that id."""

    graph: Graph
    run_id: str = "search"


@dataclass(frozen=True)
class Pace:
    """How a replayed search proceeds, as an optimize run's loop would: `patience` successive
    evaluations without a gain end it (0: never; `StopRule`), and `batch` candidates are proposed
    before any of them is judged (a run proposes `2 x --kope-jobs` at a time)."""

    patience: int = 0
    batch: int = 1


def run_search(
    agent: Agent,
    info: OperatorInfo,
    hardware: dict[str, Any],
    evaluator: Evaluator,
    budget: int,
    memory: Memory | None = None,
    pace: Pace = Pace(),
) -> list[Judged]:
    """Propose, evaluate, observe, a batch at a time, until `budget` evaluations are spent, the
    agent has nothing left or `pace.patience` evaluations bring no gain (as an optimize run's
    `StopRule` decides, unexplored axes included); returns the verdicts in evaluation order (the
    committed kernel not counted). With `memory`, the graph learns from it as from an optimize run."""
    graph, run_id = (memory.graph, memory.run_id) if memory is not None else (None, "search")
    baseline = baseline_of(info)
    incumbent = baseline
    history: list[Judged] = []
    task = graph.task_id(info.name, info.family, info.toolchain, hardware) if graph is not None else None
    if graph is not None and task is not None:
        graph.start_run(run_id, agent.name, hardware)
        graph.record(task, run_id, baseline)

    judged: set[str] = {baseline.candidate.hash}

    def seen(h: str) -> bool:
        if h in judged:
            return True
        return graph is not None and task is not None and graph.lookup(task, h) is not None

    recall = _recaller(graph, info, hardware)
    rule = StopRule(budget, pace.patience, unexplored=lambda: agent.unexplored(info.name))
    while room := rule.room(pace.batch):
        ctx = Context(info, hardware, baseline, incumbent, history, budget - len(history), recall, seen)
        proposed = agent.propose(ctx, room)
        if not proposed:
            break
        verdicts = evaluator.evaluate(proposed, incumbent)
        rule.record([j.outcome == Outcome.BETTER for j in verdicts], 0.0)
        for j in verdicts:
            if j.outcome == Outcome.BETTER:
                incumbent = j
            if graph is not None and task is not None:
                graph.record(task, run_id, j)
        if graph is not None and task is not None:
            distill(graph, task, run_id)
        history += verdicts
        judged.update(j.candidate.hash for j in verdicts)
        agent.observe(ctx, verdicts)
    return history


def _recaller(graph: Graph | None, info: OperatorInfo, hardware: dict[str, Any]) -> Callable[..., Any]:
    def recall(state: str = "", budget: int = 12, points: bool = False) -> Any:
        if graph is None:
            return None
        query = RecallQuery(
            info.name, info.family, hardware, info.toolchain, state, max_items=budget, points=points
        )
        return recall_from(graph, query)

    return recall


def evaluations_to(history: Sequence[Judged], target: float) -> int | None:
    """1-based evaluation at which a speedup of at least `target` was first seen (None: never)."""
    for i, j in enumerate(history, 1):
        if j.outcome.correct and (j.speedup or 0.0) >= target:
            return i
    return None
