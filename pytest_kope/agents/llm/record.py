"""The records of what the model was told and what it said, kept in the run folder for audit.

A prompt record is the prompt the agent opens a round with, the same that `kope context` prints: the
system prompt, the static and dynamic blocks as sent, how it was fitted to the model's context, and for
each recalled lesson or attempt its score (similarity x value x relevance), its hardware and operator
match, its size, and whether it fit the recall budget. A call record is one request (the whole
conversation as sent, the output tokens asked, the time allowed) and what came back: the reply, or the
error. Under prompts/<operator>/ each is `round-NNN` (a resend of the opening `round-NNN-resend-K`,
a call `round-NNN-call-KK`), as .json and .txt; no record overwrites another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...memory.recall import Recall, exemplar_line, tokens
from .fit import CHARS_PER_TOKEN, Counter


def explain(found: Recall | None, budget: int, rendered: str) -> dict[str, Any]:
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
    if record.get("kind") == "call":
        return call_text(record)
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
    fit = record.get("fit") or {}
    if fit:
        lines[1:1] = ["", fit_line(fit)]
    extra = [t for t in recall.get("left_out", []) if t not in {i["text"] for i in items}]
    if extra:
        lines += ["", "## Left out by recall (over its token budget)", *(f"    {t}" for t in extra)]
    count = Counter(float(fit.get("chars_per_token") or CHARS_PER_TOKEN))
    for title, key in (("System prompt", "system"), ("Static block", "static"), ("Dynamic block", "dynamic")):
        lines += ["", f"## {title} ({count(record.get(key, ''))} tokens)", record.get(key, "")]
    return "\n".join(lines) + "\n"


def fit_line(fit: dict[str, Any]) -> str:
    """How the prompt was fitted, in one line: its tokens, the context and the reply it leaves."""
    if fit.get("context"):
        where = f"context {fit['context']} tokens (from {fit.get('context_from') or '?'})"
    else:
        where = "context size unknown (the server says nothing of it; set kope_llm_context to fit)"
    said = (
        f"## Fit: prompt {fit.get('prompt_tokens')} tokens ({fit.get('counter', '')}), {where},"
        f" room for the prompt {fit.get('prompt_room') if fit.get('prompt_room') is not None else '-'},"
        f" reply up to {fit.get('reply_tokens')} tokens, size level {fit.get('level', 0)}"
    )
    return said + ("" if fit.get("fits", True) else "; DOES NOT FIT: not sent")


def call_text(record: dict[str, Any]) -> str:
    """A call record for people: what was asked, then what came back."""
    req, got = record.get("request") or {}, record.get("reply") or {}
    lines = [
        f"# Call {record.get('call')} of round {record.get('round')} for {record['operator']}:"
        f" {record.get('model')} at {record.get('api')}",
        f"asked: up to {req.get('max_tokens')} output tokens, tools {'on' if req.get('tools') else 'off'},"
        f" {req.get('seconds')} s allowed; prompt ~{req.get('prompt_tokens')} tokens",
    ]
    if record.get("error"):
        lines.append(f"error after {record.get('seconds')} s: {record['error']}")
        if got.get("text"):
            lines += ["", "## What the model said before the call ended", got["text"]]
    else:
        first = got.get("first_token_s")
        lines.append(
            f"reply: stop {got.get('stop')}, usage {json.dumps(got.get('usage'))}, {got.get('seconds')} s"
            + (f", first token after {first} s" if first is not None else "")
        )
        if record.get("outcome"):
            lines += ["", "## What became of it", str(record["outcome"])]
        lines += ["", "## Reply text", got.get("text") or "(none)"]
        for c in got.get("calls") or []:
            lines += ["", f"## Tool call {c.get('name')}", json.dumps(c.get("input"), indent=1)]
    lines += ["", "## Request messages"]
    for m in req.get("messages") or []:
        lines += ["", f"### {m.get('role')}", str(m.get("content", ""))]
    return "\n".join(lines) + "\n"


def write(folder: Path, record: dict[str, Any]) -> Path:
    """The record as prompts/<operator>/<name>.json and .txt in the run folder, never over another."""
    where = folder / "prompts" / str(record["operator"])
    where.mkdir(parents=True, exist_ok=True)
    name = f"round-{int(record.get('round', 0)):03d}"
    if record.get("kind") == "call":
        name += f"-call-{int(record.get('call', 0)):02d}"
    elif record.get("resend"):
        name += f"-resend-{int(record['resend'])}"
    path, n = where / f"{name}.json", 1
    while path.exists():  # the same name twice (a second agent, a resumed round): kept apart
        n += 1
        path = where / f"{name}-{n}.json"
    path.write_text(json.dumps(record, indent=1, default=str))
    path.with_suffix(".txt").write_text(text(record))
    return path


def _num(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)
