"""Active context management: hand the agent only the experience that matters, within a budget.

A lesson's score is structure x value x relevance:

- structure: same operator 1 > same family 0.5 > other 0.15; same hardware 1 > same arch 0.6 >
  other 0.3; same toolchain 1 > other 0.5 (see scope.py);
- value: the lesson's estimate that its key helps (lessons.py);
- relevance: 1 + up to 0.5 from FTS5 bm25 against the state ("failing with X"), when one is given.

Lessons are deduplicated by (kind, key, family), keeping the best scored. The output stays within the
count budget (``max_items``) and the token budget (``max_tokens``, estimated as len(text) // 4) however
big the graph is: SQL ranks and limits before anything reaches Python.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..hardware import fingerprint_id
from ..spec import Point
from .lessons import marks_losing
from .points import PastPoint, past_points
from .rows import CORRECT, stored_point
from .scope import (
    hardware_label,
    hardware_relation,
    hardware_row,
    operator_relation,
    structure_sql,
)

if TYPE_CHECKING:
    from .graph import Graph

POOL = 200  # lessons ranked in Python at most, from SQL's structure x value order and from FTS
RELEVANCE_BONUS = 0.5
LESSON_SHARE = 0.6  # of a token budget, what lessons may take; exemplars get the rest
_STOP = {"the", "and", "with", "for", "yet", "not", "but", "from", "this", "that", "was", "has"}


CHARS_PER_TOKEN = 4  # a conservative estimate for code and English: every token budget counts with it


def tokens(text: str) -> int:
    """A text's size in tokens, estimated with CHARS_PER_TOKEN."""
    return len(text) // CHARS_PER_TOKEN


@dataclass
class RecallQuery:
    """What to recall: for which operator, hardware and state, within which budget."""

    operator: str
    family: str
    hardware: dict[str, Any]
    toolchain: str
    state: str = ""  # "no kernel yet" / "failing with X" / "correct at 2.1x"
    max_items: int = 12  # count budget (tuner)
    max_tokens: int | None = None  # token budget (LLM)
    points: bool = False  # also return past attempts' params and speedups (the tuner's model data)


@dataclass
class RecalledLesson:
    """A lesson as recalled: its text, score and where it was learned."""

    id: int
    text: str
    score: float
    value: float
    key: str
    scope: str  # how it relates to the query: "<operator|family|other>/<hardware|arch|other>"
    kind: str = "param"
    uses: int = 0
    family: str = ""
    structure: float = 1.0  # the structure weight alone (operator, hardware, toolchain closeness)
    data: dict[str, Any] = field(default_factory=dict)
    wins: int = 0
    fails: int = 0
    effect: float | None = None  # geometric mean ratio against the parent, over correct observations
    relevance: float = 1.0  # 1 + the FTS bonus against the state: why `kope context` says it was picked

    def line(self) -> str:
        return f"- {self.text} [value {self.value:.2f}, {self.scope}]"

    def losing(self) -> bool:
        """Whether the lesson marks its key as losing (slower beyond noise, or broken), see lessons.py."""
        return marks_losing(self.uses, self.wins, self.fails, self.effect)


@dataclass
class Recall:
    """What recall found: lessons and exemplars, rendered within a token budget."""

    lessons: list[RecalledLesson] = field(default_factory=list)
    exemplars: list[dict[str, Any]] = field(default_factory=list)
    seed_points: list[Point] = field(default_factory=list)
    points: list[PastPoint] = field(default_factory=list)  # past attempts, for the tuner's model
    left_out: list[str] = field(default_factory=list)  # lines found but over the token budget

    def preferred_params(self) -> list[tuple[str, object, float]]:
        """(param, value, weight) from parameter lessons, best first: weight in [-1, 1] is the lesson's
        structure weight times 2 x value - 1, so a value that broke or slowed things is negative."""
        best: dict[tuple[str, str], tuple[str, object, float]] = {}
        for lesson in self.lessons:
            if lesson.kind != "param" or "param" not in lesson.data:
                continue
            weight = round(lesson.structure * (2 * lesson.value - 1), 6)
            name, value = lesson.data["param"], lesson.data.get("value")
            slot = (name, json.dumps(value, default=str))
            if slot not in best or abs(weight) > abs(best[slot][2]):
                best[slot] = (name, value, weight)
        return sorted(best.values(), key=lambda p: -p[2])

    def seeds(self) -> list[Point]:
        """Param points of the best similar attempts, best first (the tuner's first proposals)."""
        return [dict(p) for p in self.seed_points]

    def render(self, max_tokens: int) -> str:
        """A text block for an LLM prompt, never over `max_tokens` (len // 4)."""
        out: list[str] = []

        def add(text: str) -> bool:
            candidate = "\n".join([*out, text])
            if tokens(candidate) <= max_tokens:
                out.append(text)
                return True
            return False

        if self.lessons and add("Lessons from earlier attempts (most relevant first):"):
            for lesson in self.lessons:
                if not add(lesson.line()):
                    break
        if self.exemplars and add("Examples:"):
            for ex in self.exemplars:
                if not add(exemplar_line(ex)):
                    break
                if ex.get("source"):
                    add(f"```\n{ex['source'].rstrip()}\n```")
        return "\n".join(out)


def exemplar_line(ex: dict[str, Any]) -> str:
    speed = f"{ex['speedup']:.2f}x" if ex.get("speedup") else ex["outcome"]
    params = json.dumps(ex["params"], sort_keys=True, default=str) if ex.get("params") else ""
    parts = [f"- {ex['kind']} on {ex['operator']} ({ex.get('hardware', '')}): {speed}"]
    if params:
        parts.append(f"params {params}")
    if ex.get("idea"):
        parts.append(f"idea: {ex['idea']}")
    if ex.get("failure"):
        parts.append(f"failed: {ex['failure'][:200]}")
    if ex.get("fixed_from"):
        f = ex["fixed_from"]
        parts.append(f"fixed {f['hash'][:8]} ({f['outcome']}: {f.get('failure', '')[:120]})")
    return "; ".join(parts)


def fts_query(state: str) -> str:
    """An OR query of the state's words, each quoted (FTS5 syntax cannot break it)."""
    words = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{2,}", state.lower()) if w not in _STOP]
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


def recall_from(graph: Graph, query: RecallQuery) -> Recall:
    """The lessons and attempts most relevant to the query, within its budget."""
    hw_id = fingerprint_id(query.hardware)
    arch = hardware_row(query.hardware)["arch"]
    params = {
        "operator": query.operator,
        "family": query.family,
        "hardware_id": hw_id,
        "arch": arch,
        "toolchain": query.toolchain,
    }
    lessons = _lessons(graph, query, params)
    exemplars, seeds = _exemplars(graph, query, params)
    budget = query.max_tokens
    found = [lesson.line() for lesson in lessons] + [exemplar_line(ex) for ex in exemplars]
    if budget is not None:
        lessons = _fit(lessons, lambda lesson: tokens(lesson.line()) + 1, int(budget * LESSON_SHARE))
        spent = sum(tokens(lesson.line()) + 1 for lesson in lessons)
        exemplars = _with_sources(graph, exemplars, budget - spent)
    kept = {lesson.line() for lesson in lessons} | {exemplar_line(ex) for ex in exemplars}
    return Recall(
        left_out=[line for line in found if line not in kept],
        lessons=lessons,
        exemplars=exemplars,
        seed_points=seeds[: max(query.max_items, 1)],
        points=past_points(graph, query.operator, query.family, params) if query.points else [],
    )


def _fit(items: list[Any], cost: Any, budget: int) -> list[Any]:
    kept, spent = [], 0
    for item in items:
        c = cost(item)
        if spent + c > budget:
            break
        kept.append(item)
        spent += c
    return kept


def _lessons(graph: Graph, query: RecallQuery, params: dict[str, Any]) -> list[RecalledLesson]:
    structure = structure_sql("l")
    pool = max(POOL, query.max_items * 4)
    rows = graph.rows(
        f"SELECT l.*, {structure} AS structure FROM lessons l ORDER BY {structure} * l.value DESC, l.id DESC"
        f" LIMIT {pool}",
        params,
    )
    relevance: dict[int, float] = {}
    q = fts_query(query.state)
    if q:
        hits = graph.rows(
            f"SELECT l.*, {structure} AS structure, bm25(lessons_fts) AS bm25 FROM lessons_fts"
            " JOIN lessons l ON l.id = lessons_fts.rowid WHERE lessons_fts MATCH :q"
            f" ORDER BY bm25(lessons_fts) LIMIT {pool}",
            {**params, "q": q},
        )
        strongest = max((-h["bm25"] for h in hits), default=0.0) or 1.0
        for h in hits:
            relevance[h["id"]] = 1.0 + RELEVANCE_BONUS * max(-h["bm25"], 0.0) / strongest
        seen = {r["id"] for r in rows}
        rows += [h for h in hits if h["id"] not in seen]
    scored: list[RecalledLesson] = []
    for r in rows:
        rel = relevance.get(r["id"], 1.0)
        data = json.loads(r["data"]) if r["data"] else {}
        relation = (
            operator_relation(query.operator, query.family, r["operator"], r["family"])
            + "/"
            + hardware_relation(params["hardware_id"], params["arch"], r["hardware_id"], r["arch"])
        )
        scored.append(
            RecalledLesson(
                id=r["id"],
                text=r["text"],
                score=r["structure"] * r["value"] * rel,
                value=r["value"],
                key=r["key"],
                scope=relation,
                kind=r["kind"],
                uses=r["uses"],
                family=r["family"] or "",
                structure=r["structure"],
                data=data,
                wins=r["wins"] or 0,
                fails=r["fails"] or 0,
                effect=r["effect"],
                relevance=rel,
            )
        )
    scored.sort(key=lambda lesson: (-lesson.score, -lesson.id))
    return _distinct(scored, query.max_items)


def _distinct(scored: list[RecalledLesson], max_items: int) -> list[RecalledLesson]:
    """The strongest lessons, one per (kind, key, family) and per text, at most `max_items`."""
    kept: list[RecalledLesson] = []
    seen_keys: set[tuple[str, str, str]] = set()
    seen_text: set[str] = set()
    for lesson in scored:
        slot = (lesson.kind, lesson.key, lesson.family)
        if slot in seen_keys or lesson.text in seen_text:
            continue
        seen_keys.add(slot)
        seen_text.add(lesson.text)
        kept.append(lesson)
        if len(kept) >= max_items:
            break
    return kept


def _exemplars(
    graph: Graph, query: RecallQuery, params: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[Point]]:
    """Best attempts here and on similar tasks, instructive failures, bad -> good pairs; and seeds."""
    n = max(2, query.max_items // 3)
    structure = structure_sql("t", arch="h.arch")
    similar = "FROM attempts a JOIN tasks t ON t.id = a.task_id LEFT JOIN hardware h ON h.id = t.hardware_id"
    cols = "a.*, t.operator, t.family, h.label AS hardware"
    correct = f"a.outcome IN ('{CORRECT[0]}', '{CORRECT[1]}') AND a.speedup IS NOT NULL"
    best = graph.rows(
        f"SELECT {cols}, {structure} AS structure {similar} WHERE {correct} AND {structure} >= 0.1"
        f" ORDER BY {structure} * min(a.speedup, 100) DESC, a.id LIMIT {max(query.max_items, n) * 2}",
        params,
    )
    seeds = _seeds(best)
    failing = f"a.outcome NOT IN ('{CORRECT[0]}', '{CORRECT[1]}', 'suspect')"
    q = fts_query(query.state)
    if q:  # failures whose messages read like the current state, on similar tasks
        failures = graph.rows(
            f"SELECT {cols}, o.text AS failure {similar} JOIN observations o ON o.attempt_id = a.id"
            " JOIN observations_fts ON observations_fts.rowid = o.id"
            f" WHERE observations_fts MATCH :q AND {failing} AND {structure} >= 0.15"
            f" ORDER BY bm25(observations_fts) LIMIT {n}",
            {**params, "q": q},
        )
    else:
        failures = graph.rows(
            f"SELECT {cols}, (SELECT o.text FROM observations o WHERE o.attempt_id = a.id"
            " AND o.kind IN ('test_failure', 'screen', 'crash') ORDER BY o.id LIMIT 1) AS failure"
            f" {similar} WHERE {failing} AND t.operator = :operator ORDER BY a.id DESC LIMIT {n}",
            params,
        )
    fixes = graph.rows(
        f"SELECT {cols}, p.candidate_hash AS p_hash, p.outcome AS p_outcome,"
        " (SELECT o.text FROM observations o WHERE o.attempt_id = p.id"
        " AND o.kind IN ('test_failure', 'screen', 'crash') ORDER BY o.id LIMIT 1) AS p_failure"
        f" {similar} JOIN attempts p ON p.task_id = a.task_id AND p.candidate_hash = a.parent_hash"
        f" WHERE {correct} AND p.outcome NOT IN ('{CORRECT[0]}', '{CORRECT[1]}', 'suspect')"
        f" AND {structure} >= 0.15 ORDER BY {structure} DESC, a.id DESC LIMIT {max(1, n // 2)}",
        params,
    )
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for kind, rows in (("best", best[:n]), ("failure", failures), ("fix", fixes)):
        for r in rows:
            if kind + r["candidate_hash"] in seen:
                continue
            seen.add(kind + r["candidate_hash"])
            ex = _exemplar(kind, r)
            if kind == "fix":
                ex["fixed_from"] = {
                    "hash": r["p_hash"],
                    "outcome": r["p_outcome"],
                    "failure": r["p_failure"] or "",
                }
            out.append(ex)
    return out[: max(query.max_items, 1)], seeds


def _seeds(best: list[dict[str, Any]]) -> list[Point]:
    """The distinct tuning points of the best attempts, best first: where a search may start."""
    seeds: list[Point] = []
    seen_points: set[str] = set()
    for r in best:
        point = stored_point(r["params"])
        key = json.dumps(point, sort_keys=True, default=str)
        if point and key not in seen_points:
            seen_points.add(key)
            seeds.append(point)
    return seeds


def _exemplar(kind: str, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": kind,
        "operator": r["operator"],
        "family": r["family"],
        "hardware": r["hardware"] or "",
        "agent": r["agent"],
        "hash": r["candidate_hash"],
        "params": json.loads(r["params"]) if r["params"] else {},
        "idea": r["idea"] or "",
        "outcome": r["outcome"],
        "speedup": r["speedup"],
        "failure": r.get("failure") or "",
        "structure": r.get("structure"),
        "source_hash": r["source_hash"],
        "source": None,
    }


def _with_sources(graph: Graph, exemplars: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """Keep the exemplars that fit the budget; attach sources (best ones first) where room is left."""
    kept = _fit(exemplars, lambda ex: tokens(exemplar_line(ex)) + 1, budget)
    left = budget - sum(tokens(exemplar_line(ex)) + 1 for ex in kept)
    shown: set[str] = set()
    for ex in kept:
        if ex["kind"] not in ("best", "fix") or not ex.get("source_hash") or ex["source_hash"] in shown:
            continue
        row = graph.db.execute("SELECT text FROM sources WHERE hash = ?", (ex["source_hash"],)).fetchone()
        cost = tokens(f"```\n{row[0].rstrip()}\n```") + 1 if row else None
        if cost is not None and cost <= left:
            ex["source"] = row[0]
            shown.add(ex["source_hash"])
            left -= cost
    return kept


__all__ = ["Recall", "RecallQuery", "RecalledLesson", "hardware_label", "recall_from", "tokens"]
