"""The tuner's data from the graph: past attempts' values and speedups, each tagged with its source.

Recall hands these to the tuner's effect model (`effects.py`), which weighs each source by how well it
has predicted this operator so far; lessons are ranked elsewhere (`recall.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from ..spec import Point
from .rows import CORRECT, stored_point
from .scope import hardware_relation, operator_relation

if TYPE_CHECKING:
    from .graph import Graph

POINTS = 5000  # past attempts handed to the tuner's model at most (newest first)


class PastPoint(TypedDict):
    """One past attempt as the tuner's model reads it."""

    source: str  # "<operator>#<task id>"
    relation: str  # "<operator|family|other>/<hardware|arch|other>"
    params: Point
    speedup: float | None
    correct: bool
    outcome: str


def past_points(graph: Graph, operator: str, family: str, params: dict[str, Any]) -> list[PastPoint]:
    """Past attempts of this toolchain with their params and outcome, each tagged with its source
    (task) and how it relates to the query ("<operator|family|other>/<hardware|arch|other>"): the data
    the tuner's effect model learns from, weighing each source by how well it predicts this operator."""
    rows = graph.rows(
        "SELECT a.params, a.speedup, a.outcome, a.agent, t.id AS task, t.operator, t.family,"
        " t.hardware_id, h.arch FROM attempts a JOIN tasks t ON t.id = a.task_id"
        " LEFT JOIN hardware h ON h.id = t.hardware_id WHERE t.toolchain = :toolchain"
        f" AND a.outcome NOT IN ('rejected', 'suspect') ORDER BY a.id DESC LIMIT {POINTS}",
        params,
    )
    out: list[PastPoint] = []
    for r in rows:
        point = stored_point(r["params"])
        if not point:
            continue
        relation = (
            operator_relation(operator, family, r["operator"], r["family"] or "")
            + "/"
            + hardware_relation(params["hardware_id"], params["arch"], r["hardware_id"], r["arch"] or "")
        )
        out.append(
            {
                "source": f"{r['operator']}#{r['task']}",
                "relation": relation,
                "params": point,
                "speedup": r["speedup"],
                "correct": r["outcome"] in CORRECT,
                "outcome": r["outcome"],
            }
        )
    return out
