"""The prompt record: what the model was told and why each recalled piece is in it.

One record per prompt the agent opens a round with, the same that `kope context` prints: the system
prompt, the static and dynamic blocks as sent, and for each recalled lesson or attempt its score
(similarity x value x relevance), its hardware and operator match, its size, and whether it fit the
recall budget. The run folder keeps one per round under prompts/<operator>/ so a run can be audited.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...memory.recall import exemplar_line, tokens


def explain(found: Any, budget: int, rendered: str) -> dict[str, Any]:
    """Why each item recall found is in the rendered experience block, or why it is not."""
    items: list[dict[str, Any]] = []
    for lesson in getattr(found, "lessons", []) or []:
        line = lesson.line()
        items.append(
            {
                "kind": f"lesson ({lesson.kind})",
                "text": line,
                "tokens": tokens(line) + 1,
                "shown": line in rendered,
                "why": {
                    "score": round(lesson.score, 4),
                    "similarity": round(lesson.structure, 4),
                    "value": round(lesson.value, 4),
                    "relevance": round(getattr(lesson, "relevance", 1.0), 4),
                    "match": lesson.scope,  # <operator|family|other>/<hardware|arch|other>
                },
            }
        )
    for ex in getattr(found, "exemplars", []) or []:
        line = exemplar_line(ex)
        similarity = ex.get("structure")
        items.append(
            {
                "kind": f"attempt ({ex['kind']})",
                "text": line,
                "tokens": tokens(line) + 1,
                "shown": line in rendered,
                "why": {
                    "similarity": None if similarity is None else round(float(similarity), 4),
                    "operator": ex.get("operator"),
                    "hardware": ex.get("hardware"),
                    "speedup": ex.get("speedup"),
                },
            }
        )
    left_out = [i["text"] for i in items if not i["shown"]] + list(getattr(found, "left_out", []) or [])
    return {"budget_tokens": budget, "used_tokens": tokens(rendered), "items": items, "left_out": left_out}


def text(record: dict[str, Any]) -> str:
    """A record for people: the recall explained first, then the prompt exactly as sent."""
    recall = record.get("recall") or {}
    items = recall.get("items", [])
    head = (
        f"# Prompt for {record['operator']}: agent {record['agent']}, provider {record['provider']},"
        f" model {record['model']}{', plain-text protocol' if record.get('plain') else ''}"
    )
    lines = [
        head,
        "",
        f"## Recalled experience: {recall.get('used_tokens', 0)} of {recall.get('budget_tokens', 0)} tokens"
        f" of the recall budget, {sum(1 for i in items if i['shown'])} items shown,"
        f" {len(recall.get('left_out', []))} left out",
    ]
    for i in items:
        why = ", ".join(f"{k} {_num(v)}" for k, v in i["why"].items() if v not in (None, ""))
        lines.append(f"{'shown' if i['shown'] else 'left out'}: {i['kind']}, {i['tokens']} tokens; {why}")
        lines.append(f"    {i['text']}")
    extra = [t for t in recall.get("left_out", []) if t not in {i["text"] for i in items}]
    if extra:
        lines += ["", "## Left out by recall (over its token budget)", *(f"    {t}" for t in extra)]
    for title, key in (("System prompt", "system"), ("Static block", "static"), ("Dynamic block", "dynamic")):
        lines += ["", f"## {title} ({tokens(record.get(key, ''))} tokens)", record.get(key, "")]
    return "\n".join(lines) + "\n"


def write(folder: Path, record: dict[str, Any]) -> Path:
    """The record as prompts/<operator>/round-NNN.json and .txt in the run folder."""
    where = folder / "prompts" / str(record["operator"])
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"round-{int(record.get('round', 0)):03d}.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    path.with_suffix(".txt").write_text(text(record))
    return path


def _num(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)
