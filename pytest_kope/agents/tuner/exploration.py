"""What a search has not explored: the axes no evidence speaks for, tried around the incumbent or not.

A warm start follows what the experience graph knows; on an axis the graph says nothing about, its
first guess is a guess. An axis counts as *known* when the graph holds two or more of its values
judged for this operator, or for its family on this hardware; an unknown axis counts as *explored*
once this search has judged two points one move away from the incumbent on that axis (one-axis
neighbours: two values besides the incumbent's; a value the space's `require`s forbid there comes
with the smallest move on one other axis that allows it), or every such neighbour the space has. Until
every unknown axis is explored, "no gain in N" does not end the search (`StopRule`), and the tuner
probes those axes itself (`probe`). A new incumbent has new neighbours: exploration starts again
around it, within the budget.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...memory.effects import value_key
from ...spec import Point, Scalar, TuningSpace

NEAR = 2  # one-axis neighbours of the incumbent judged before an axis counts as explored (where it has them)
# relations (recall's "operator/hardware" form) whose points count as evidence on an axis
EVIDENT = ("operator/", "family/hardware")


@dataclass
class Exploration:
    """Per operator, for the report: which axes the graph knew, which the search explored around its
    incumbent, and which it never did (the budget or the time ran out first)."""

    known: list[str] = field(default_factory=list)
    explored: list[str] = field(default_factory=list)
    untried: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[str]]:
        return {"known": self.known, "explored": self.explored, "untried": self.untried}


def evident(relation: str) -> bool:
    """Whether points of a recalled source with this relation speak for this operator here."""
    return any(relation == e or (e.endswith("/") and relation.startswith(e)) for e in EVIDENT)


def known_axes(space: TuningSpace, rows: Iterable[tuple[str, Mapping[str, Scalar]]]) -> set[str]:
    """The axes of `space` with two or more values among the evident rows (relation, params)."""
    values: dict[str, set[str]] = {}
    for relation, params in rows:
        if evident(relation):
            for name, value in params.items():
                if name in space.axes:
                    values.setdefault(name, set()).add(value_key(name, value))
    return {name for name, seen in values.items() if len(seen) >= 2}


def neighbours(space: TuningSpace, centre: Mapping[str, Scalar], axis: str) -> list[Point]:
    """The points of `space` one move from `centre` on `axis`, in the axis's declared order. A value
    the space's `require`s forbid at `centre` is reached by the smallest move on one other axis that
    allows it (`nearest`): on a boundary such as ``MT * NB <= 128`` a wider NB comes with a smaller MT,
    where a move on `axis` alone would never leave the corner the incumbent sits in."""
    out: list[Point] = []
    for value in space.axes[axis]:
        if value != centre.get(axis):
            point = nearest(space, {**centre, axis: value}, axis)
            if point is not None:
                out.append(point)
    return out


def nearest(space: TuningSpace, point: Mapping[str, Scalar], fixed: str) -> Point | None:
    """`point` if the space allows it, else the allowed point that differs from it on one axis other
    than `fixed`, by the fewest steps in that axis's declared order (the earlier axis on a tie);
    None when no such point is allowed."""
    if space.allows(point):
        return dict(point)
    best: tuple[int, Point] | None = None
    for name, values in space.axes.items():
        if name == fixed or name not in point or point[name] not in values:
            continue
        at = values.index(point[name])
        for i, value in enumerate(values):  # i == at is `point` itself, which is not allowed
            moved = {**point, name: value}
            if (best is None or abs(i - at) < best[0]) and space.allows(moved):
                best = (abs(i - at), moved)
    return best[1] if best is not None else None


def unexplored(
    space: TuningSpace, known: set[str], centre: Mapping[str, Scalar], judged: Iterable[Mapping[str, Scalar]]
) -> list[str]:
    """The unknown axes, in declared order, on which fewer than NEAR one-axis neighbours of `centre`
    were judged (or fewer than it has: an axis with no neighbour in the space has nothing to explore)."""
    around = {point_key(p) for p in judged}
    out = []
    for axis in space.axes:
        if axis in known:
            continue
        near = neighbours(space, centre, axis)
        if sum(point_key(p) in around for p in near) < min(NEAR, len(near)):
            out.append(axis)
    return out


def exploration(
    space: TuningSpace, known: set[str], centre: Mapping[str, Scalar], judged: Iterable[Mapping[str, Scalar]]
) -> Exploration:
    """The report's view of one search (axes of a single value are left out: nothing to explore)."""
    left = unexplored(space, known, centre, judged)
    tunable = [a for a in space.axes if len(space.axes[a]) > 1]
    return Exploration(
        known=[a for a in tunable if a in known],
        explored=[a for a in tunable if a not in known and a not in left],
        untried=[a for a in tunable if a in left],
    )


def point_key(point: Mapping[str, Scalar]) -> str:
    """A point's values as one stable string, whatever their types (a table's key too)."""
    return json.dumps(dict(point), sort_keys=True, default=str)
