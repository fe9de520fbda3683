"""One operator's search by the tuner: what it has judged, what the graph said, and when the graph is
dropped (the state `agent.py` decides from; kept per operator, so one search never skews another)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...memory.effects import AdditiveModel, value_key
from ...memory.transfer import Source
from ...spec import Point, Scalar, TuningSpace
from . import exploration as ex


@dataclass
class Search:
    """One operator's search: own verdicts, the graph's points by source, the bandit, coverage."""

    space: TuningSpace
    observed: list[tuple[Point, float | None]] = field(default_factory=list)  # None: broke
    sources: dict[str, Source] = field(default_factory=dict)  # the graph's sources, fitted once
    losers: set[str] = field(default_factory=set)  # values trusted sources agree lose (graph arm)
    arms: dict[str, list[float]] = field(default_factory=dict)  # arm -> [successes, failures] (+ prior)
    arm_of: dict[str, str] = field(default_factory=dict)  # candidate hash -> the arm that proposed it
    pulls: dict[str, int] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)  # value keys seen in this search
    weights: dict[str, float] = field(default_factory=dict)  # source -> weight at the last refit
    model: AdditiveModel | None = None  # this operator's verdicts, with the graph as the prior
    fitted_at: int = -1
    points: tuple[TuningSpace, list[Point]] | None = None  # the space, enumerated
    known: set[str] = field(default_factory=set)  # axes the graph has evidence on (exploration.py)
    dropped: bool = False  # the graph stopped paying: the rest of this search is a cold one's
    judged: list[Point] = field(default_factory=list)  # points judged, here or before
    centre: Point = field(default_factory=dict)  # the incumbent's point
    since_gain: int = 0  # this search's verdicts since the last gain
    verdicts: int = 0  # verdicts this search has received
    guessed: bool = False  # a warm run's probe after its first guesses has had its turn
    last_arm: str = ""  # the arm of the last proposal

    def on_space(self, params: Mapping[str, Scalar]) -> Point:
        """`params` on this space's axes (a value it lacks: the axis's default)."""
        return {n: params.get(n, values[0]) for n, values in self.space.axes.items()}

    def unexplored(self) -> list[str]:
        return ex.unexplored(self.space, self.known, self.centre, self.judged)


def doubt(s: Search, lost: Point, incumbent: Point) -> None:
    """The graph's pick lost head to head: each source that predicted it would win is believed less
    for the rest of the run (the prior is refit before the next proposal)."""
    for source in s.sources.values():
        if source.predicted_a_win(lost, incumbent):
            source.lost += 1
            s.fitted_at = -1


def drop_graph(s: Search) -> None:
    """The graph stopped paying (`tuner.GRAPH_PATIENCE` verdicts without a gain): the rest of the
    budget is searched as a cold run would, from this operator's verdicts alone (the declaration as
    the prior, no graph arm, no axis known, so patience waits until every axis was tried around the
    incumbent). Its sources keep their trust by ranking the big effects right, so only this lets a
    warm run leave a sibling's optimum at another shape (bench/shape_shift.py)."""
    s.dropped = True
    s.arms.pop("graph", None)
    s.known = set()
    s.weights = {name: 0.0 for name in s.weights}
    s.losers = set()


def untried_values(s: Search) -> dict[str, list[Scalar]]:
    """Each axis's values the search has not tried yet."""
    return {n: [v for v in values if value_key(n, v) not in s.tried] for n, values in s.space.axes.items()}


def covering(s: Search) -> int:
    """The fewest proposals that try every value not yet tried (a point tries one value an axis)."""
    return max(map(len, untried_values(s).values()), default=0)
