"""Distilling lessons: after each round, what did each child attempt teach, compared with its parent?

- A tuner child (same source as its parent, other parameter values) teaches one lesson per changed
  value: ``BLOCK=16: 1.42x on softmax (rowwise, AMD EPYC 7B13 avx2)``, or ``VEC=16 broke correctness
  on transpose (layout, ...)``.
- A child with new source (the LLM's, a replayed one) teaches its idea with the measured effect, and
  one lesson per technique tag (tags.py: read from the lines it added and its idea), keyed by tag,
  family and hardware, with the idea texts kept as evidence; a technique that broke correctness or the
  build is a lesson too, with the reason.

A parameter lesson's effect is not the effect of the jump that happened to contain its value: after
each distillation, an additive model of log speedup (effects.py) is refitted over every correct
attempt of the family on this hardware (one intercept per operator), and each value's lesson carries
that fitted effect, its standard error and how many attempts had the value (`data["estimate"]`).

A lesson is identified by its key and scope (kind, key, operator, toolchain, hardware): seeing the same
key again updates that lesson rather than adding a row. Its ``value`` is the Beta(1, 1) posterior mean
that the key helps, ``(wins + 1) / (uses + 2)``: a lesson whose key keeps helping rises towards 1, one
that misleads (slower, broken) decays towards 0. ``effect`` is the geometric mean of the measured
ratios over the correct observations.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..judge.outcome import Outcome
from ..spec import Point, Scalar
from .effects import AdditiveModel, Observation, value_key
from .rows import CORRECT, expand_attempt, new_id, now, stored_point, writing
from .tags import technique_tags

if TYPE_CHECKING:
    from .graph import Graph

NOISE = 1.05  # a ratio within 5% of 1 is neither a gain nor a loss (compute-bound noise here)
IDEA_KEY_CHARS = 200
IDEAS_KEPT = 5  # idea texts a technique lesson keeps as evidence
FAILING = {
    Outcome.INCORRECT.value: "broke correctness",
    Outcome.COMPILE_FAILED.value: "failed to compile",
    Outcome.RUNTIME_FAILED.value: "failed at run time",
    Outcome.CRASHED.value: "crashed",
    Outcome.TIMEOUT.value: "timed out",
}
IGNORED = {Outcome.REJECTED.value, Outcome.SUSPECT.value}  # screened out, or a speed not yet believed


@dataclass
class Evidence:
    """One observation of a key: what an attempt showed against its parent."""

    kind: str  # param | idea
    key: str
    data: dict[str, Any]
    outcome: str
    effect: float | None  # ratio against the parent, when correct and timed
    failure: str = ""  # first failure message, when not correct
    helped: bool = field(init=False)
    failed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.failed = self.outcome in FAILING
        self.helped = self.outcome in CORRECT and (
            self.outcome == Outcome.BETTER.value or (self.effect or 0.0) >= NOISE
        )


def idea_key(idea: str) -> str:
    """The key a lesson about an idea is stored under (its normalized text)."""
    return re.sub(r"\s+", " ", idea.strip().lower())[:IDEA_KEY_CHARS]


def param_key(name: str, value: Scalar) -> str:
    """The key a lesson about a tuning value is stored under, e.g. 'BLOCK=16'."""
    return f"{name}={value}"


def evidence(
    attempt: dict[str, Any],
    parent: dict[str, Any] | None,
    failure: str = "",
    parent_source: str = "",
    source: str = "",
) -> list[Evidence]:
    """What one attempt teaches against its parent (or the baseline when it names none)."""
    outcome = attempt["outcome"]
    if attempt.get("agent") == "baseline" or outcome in IGNORED:
        return []
    effect = None
    if outcome in CORRECT:
        if attempt.get("speedup") and parent and parent.get("speedup"):
            effect = attempt["speedup"] / parent["speedup"]
        else:
            effect = attempt.get("ratio") or attempt.get("speedup")
    if parent is not None and attempt["source_hash"] == parent["source_hash"]:
        mine: Point = attempt["params"]  # checked by expand_attempt
        theirs: Point = parent["params"]
        changed = [k for k in sorted(mine) if mine[k] != theirs.get(k)]
        return [
            Evidence("param", param_key(k, mine[k]), {"param": k, "value": mine[k]}, outcome, effect, failure)
            for k in changed
        ]
    if attempt.get("idea"):
        idea = attempt["idea"]
        tags = technique_tags(idea, parent_source, source)
        return [Evidence("idea", idea_key(idea), {"idea": idea}, outcome, effect, failure)] + [
            Evidence("technique", tag, {"tag": tag, "idea": idea}, outcome, effect, failure) for tag in tags
        ]
    return []


def distill(graph: Graph, task_id: int, run_id: str) -> list[int]:
    """Turn this run's new attempts of the task into lessons, in one transaction; returns lesson ids."""
    task = graph.task(task_id)
    ids: list[int] = []
    with writing(graph.db):
        fresh = graph.rows(
            "SELECT * FROM attempts WHERE task_id = ? AND run_id = ? AND distilled = 0 ORDER BY id",
            (task_id, run_id),
        )
        baseline = graph.one(
            "SELECT * FROM attempts WHERE task_id = ? AND agent = 'baseline' ORDER BY id LIMIT 1", (task_id,)
        )
        for row in fresh:
            attempt = expand_attempt(row)
            parent = _parent(graph, task_id, attempt, baseline)
            failure = _first_failure(graph, attempt["id"])
            texts = _sources(graph, attempt, parent)
            for ev in evidence(attempt, parent, failure, *texts):
                lesson_id = learn(graph, task, ev)
                graph.edge("lesson", lesson_id, "learned_from", "attempt", attempt["id"])
                graph.edge("lesson", lesson_id, "about", "task", task_id)
                ids.append(lesson_id)
            graph.db.execute("UPDATE attempts SET distilled = 1 WHERE id = ?", (attempt["id"],))
        if fresh:
            refit_estimates(graph, task)
    return list(dict.fromkeys(ids))


def _sources(graph: Graph, attempt: dict[str, Any], parent: dict[str, Any] | None) -> tuple[str, str]:
    """The parent's and the attempt's source texts, when the attempt brought new source (else empty)."""
    if parent is not None and attempt["source_hash"] == parent["source_hash"]:
        return "", ""
    hashes = [parent["source_hash"] if parent else "", attempt["source_hash"]]
    texts = []
    for h in hashes:
        row = graph.db.execute("SELECT text FROM sources WHERE hash = ?", (h,)).fetchone() if h else None
        texts.append(str(row[0]) if row else "")
    return texts[0], texts[1]


ESTIMATE_ATTEMPTS = 5000  # newest correct attempts of a family on a hardware the model is fitted on


def refit_estimates(graph: Graph, task: dict[str, Any]) -> None:
    """Refit the family's additive model on this hardware and write each value's estimate into the
    parameter lessons of the family's operators here (effect, standard error, count)."""
    rows = graph.rows(
        "SELECT a.params, a.speedup, t.operator FROM attempts a JOIN tasks t ON t.id = a.task_id"
        " WHERE t.family = ? AND t.hardware_id = ? AND t.toolchain = ? AND a.speedup > 0"
        f" AND a.outcome IN ('{CORRECT[0]}', '{CORRECT[1]}') ORDER BY a.id DESC LIMIT {ESTIMATE_ATTEMPTS}",
        (task["family"] or "", task["hardware_id"], task["toolchain"]),
    )
    if not task["family"]:
        rows = [r for r in rows if r["operator"] == task["operator"]]
    observations = []
    axes: dict[str, list[Scalar]] = {}
    for r in rows:
        point = stored_point(r["params"])
        for k, v in point.items():
            if v not in axes.setdefault(k, []):
                axes[k].append(v)
        observations.append(Observation(point, math.log(r["speedup"]), r["operator"]))
    if len(observations) < 2:
        return
    model = AdditiveModel(axes).fit(observations)
    base = graph.one(
        "SELECT params FROM attempts WHERE task_id = ? AND agent = 'baseline' ORDER BY id LIMIT 1",
        (task["id"],),
    )
    defaults = stored_point(base["params"]) if base else {}
    lessons = graph.rows(
        "SELECT * FROM lessons WHERE kind = 'param' AND hardware_id = ? AND toolchain = ?"
        " AND (family = ? OR operator = ?)",
        (task["hardware_id"], task["toolchain"], task["family"] or "", task["operator"]),
    )
    for lesson in lessons:
        data = json.loads(lesson["data"]) if lesson["data"] else {}
        if "param" not in data:
            continue
        name, value = data["param"], data.get("value")
        if name not in defaults or defaults[name] == value or not isinstance(value, (int, float, str)):
            continue
        est = model.contrast(value_key(name, value), value_key(name, defaults[name]))
        if est is None or est.count == 0:
            continue
        data["estimate"] = {
            "effect": round(est.ratio, 4),
            "se": round(est.se, 4),
            "count": est.count,
            "against": f"{name}={defaults[name]}",
            "family": task["family"] or "",
            "attempts": len(observations),
        }
        row = {**lesson, "effect": est.ratio, "data": json.dumps(data, sort_keys=True, default=str)}
        row["text"] = describe(row, data, task.get("hardware") or "")
        graph.db.table("lessons").update(lesson["id"], {k: row[k] for k in ("effect", "data", "text")})


def _parent(
    graph: Graph, task_id: int, attempt: dict[str, Any], baseline: dict[str, Any] | None
) -> dict[str, Any] | None:
    if attempt.get("parent_hash"):
        row = graph.one(
            "SELECT * FROM attempts WHERE task_id = ? AND candidate_hash = ?",
            (task_id, attempt["parent_hash"]),
        )
        if row is not None:
            return expand_attempt(row)
    if baseline is not None and baseline["id"] != attempt["id"]:
        return expand_attempt(dict(baseline))
    return None


def _first_failure(graph: Graph, attempt_id: int) -> str:
    row = graph.db.execute(
        "SELECT text FROM observations WHERE attempt_id = ? AND kind IN ('test_failure', 'screen', 'crash')"
        " ORDER BY id LIMIT 1",
        (attempt_id,),
    ).fetchone()
    return str(row[0]) if row else ""


def learn(graph: Graph, task: dict[str, Any], ev: Evidence) -> int:
    """Add one observation to the lesson of its key and scope (creating it); returns the lesson id."""
    scope = (ev.kind, ev.key, task["operator"], task["toolchain"], task["hardware_id"])
    old = graph.one(
        "SELECT * FROM lessons WHERE kind = ? AND key = ? AND operator = ? AND toolchain = ? AND hardware_id = ?",
        scope,
    )
    uses = (old["uses"] if old else 0) + 1
    wins = (old["wins"] if old else 0) + int(ev.helped)
    fails = (old["fails"] if old else 0) + int(ev.failed)
    effect = old["effect"] if old else None
    if ev.effect is not None and ev.effect > 0:
        correct_before = (old["uses"] - old["fails"]) if old and old["effect"] else 0
        logs = math.log(effect) * correct_before if effect else 0.0
        effect = math.exp((logs + math.log(ev.effect)) / (correct_before + 1))
    data = {**(json.loads(old["data"]) if old and old["data"] else {}), **ev.data}
    if ev.kind == "technique":  # the idea texts are the evidence: the most recent few, distinct
        ideas = [i for i in data.get("ideas", []) if i != ev.data.get("idea")]
        data["ideas"] = [*ideas, ev.data.get("idea", "")][-IDEAS_KEPT:]
    if ev.failed:
        data["last_failure"] = {"outcome": ev.outcome, "message": ev.failure[:300]}
    row = {
        "kind": ev.kind,
        "key": ev.key,
        "operator": task["operator"],
        "family": task["family"] or "",
        "toolchain": task["toolchain"],
        "hardware_id": task["hardware_id"],
        "arch": task.get("arch") or "",
        "effect": effect,
        "value": value_of(wins, uses),
        "uses": uses,
        "wins": wins,
        "fails": fails,
        "data": json.dumps(data, sort_keys=True, default=str),
        "updated": now(),
    }
    row["text"] = describe(row, data, task.get("hardware") or "")
    if old is None:
        return new_id(graph.db.table("lessons").insert({**row, "created": row["updated"]}))
    graph.db.table("lessons").update(old["id"], row)
    return int(old["id"])


def value_of(wins: int, uses: int) -> float:
    """Posterior mean that the key helps, from a uniform prior."""
    return (wins + 1) / (uses + 2)


LOSING_VALUE = 0.25  # 0 helps in 2 tries, at most 1 in 6, 2 in 10: one lucky noise win is forgiven


def marks_losing(uses: int, wins: int, fails: int, effect: float | None) -> bool:
    """Whether a lesson says its key loses: tried at least twice, (almost) never helped, and it mostly
    broke things or made them slower beyond noise."""
    if uses < 2 or value_of(wins, uses) > LOSING_VALUE:
        return False
    return fails * 2 > uses or (effect is not None and effect < 1 / NOISE)


def describe(row: dict[str, Any], data: dict[str, Any], hardware: str) -> str:
    """The lesson in one sentence, from its current evidence."""
    family = f"{row['family']}, " if row["family"] else ""
    where = f"on {row['operator']} ({family}{hardware or row['hardware_id']})"
    subject = data.get("idea", row["key"]) if row["kind"] == "idea" else row["key"]
    if row["kind"] == "technique":
        subject = f"technique {row['key']}"
        ideas = [i for i in data.get("ideas", []) if i]
        evidence_text = f' (e.g. "{ideas[-1][:100]}")' if ideas else ""
    else:
        evidence_text = ""
    estimate = data.get("estimate") if row["kind"] == "param" else None
    uses, wins, fails, effect = row["uses"], row["wins"], row["fails"], row["effect"]
    tally = f" ({wins} of {uses} tries helped)" if uses > 1 else ""
    if fails * 2 > uses:
        last = data.get("last_failure", {})
        verb = FAILING.get(last.get("outcome", ""), "failed")
        reason = row["kind"] in ("idea", "technique") and last.get("message")
        message = f": {last['message'][:120]}" if reason else ""
        tally = f" ({fails} of {uses} tries)" if uses > 1 else ""
        return f"{subject} {verb} {where}{tally}{message}{evidence_text}"
    if estimate:
        spread = math.exp(estimate["se"]) - 1
        fit = (
            f" (against {estimate['against']}, fitted over {estimate['attempts']} attempts of the family"
            f" here, {estimate['count']} with it)"
        )
        return f"{subject}: {estimate['effect']:.2f}x +-{100 * spread:.0f}% {where}{fit}"
    if effect is None:
        return f"{subject}: not measured {where}{tally}{evidence_text}"
    if wins and effect >= 1.0:
        return f"{subject}: {effect:.2f}x {where}{tally}{evidence_text}"
    verdict = "slower" if effect < 1 / NOISE else "no gain"
    return f"{subject}: {verdict} ({effect:.2f}x) {where}{tally}{evidence_text}"


def learned_in_run(graph: Graph, run_id: str, operator: str, limit: int = 5) -> list[dict[str, Any]]:
    """The lessons this run's attempts of an operator taught or confirmed, those with the strongest
    evidence first (a large effect seen often, or a value that keeps breaking things)."""
    rows = graph.rows(
        "SELECT DISTINCT l.* FROM lessons l JOIN edges e ON e.src_kind = 'lesson'"
        " AND e.src_id = CAST(l.id AS TEXT) AND e.rel = 'learned_from' AND e.dst_kind = 'attempt'"
        " JOIN attempts a ON a.id = CAST(e.dst_id AS INTEGER) JOIN tasks t ON t.id = a.task_id"
        " WHERE a.run_id = ? AND t.operator = ?",
        (run_id, operator),
    )

    def weight(r: dict[str, Any]) -> float:
        size = abs(math.log(r["effect"])) if r["effect"] else 0.0
        broken = 1.0 if r["fails"] * 2 > r["uses"] else 0.0
        return float((size + broken) * min(r["uses"], 4))

    rows.sort(key=lambda r: (-weight(r), r["id"]))
    return [
        {
            "text": r["text"],
            "kind": r["kind"],
            "key": r["key"],
            "value": round(r["value"], 3),
            "uses": r["uses"],
            "effect": r["effect"],
            "losing": marks_losing(r["uses"], r["wins"], r["fails"], r["effect"]),
        }
        for r in rows[:limit]
        if weight(r) > 0
    ]
