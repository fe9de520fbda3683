"""The LLM agent's tools, apart from the conversation: `submit_candidate` (checks a source against
the operator's contract and screen), `compile_draft` (a quick build in the judge's sandbox), the
`tuning_space` merge, and the candidates of a plain-text reply (models served without tool calls)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...candidate import Candidate
from ...errors import SpecError
from ...judge.controller import draft
from ...spec import FLAGS, parse_spec
from ..base import Context
from . import prompt

COMPILER_CHARS = 2_000
_KOPE_LINE = re.compile(r"^\s*(?://+|#+|/\*+|\*+)?\s*kope:")
_FENCED = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```", re.S | re.M)
_IDEA = re.compile(r"^\W*idea\W*:\s*(.+)$", re.I | re.M)
_CODE_START = re.compile(r"^\s*(?:(?://+|/\*+|\*)?\s*kope:|#\s*(?:include|define|ifndef|ifdef|if|pragma)\b)")


def submit(
    ctx: Context,
    inp: dict[str, Any],
    accepted: list[Candidate],
    n: int,
    scrub: Callable[[str], str],
    agent: str,
) -> tuple[str, bool]:
    """The `submit_candidate` tool: a candidate appended to `accepted`, or why not; (text, is_error)."""
    op = ctx.operator
    source, idea, space = inp.get("source"), inp.get("idea"), inp.get("tuning_space")
    if not isinstance(source, str) or not source.strip():
        return needs("source") + " (the complete kernel source file)", True
    if not isinstance(idea, str) or not idea.strip():
        return needs("idea") + " (one line: what changes and why it is faster)", True
    if len(accepted) >= n:
        return f"this round's batch of {n} is full; wait for the verdicts", True
    notes: list[str] = []
    try:
        if isinstance(space, str) and space.strip():
            source = merge_space(source, space, op.filename, notes)
        spec = parse_spec(source, op.filename)
        if not spec.kernels:
            source = "".join(f"{_comment(op.filename)} kope: kernel {k}\n" for k in op.kernels) + source
            notes.append("added the operator's `kope: kernel` lines to the header")
            spec = parse_spec(source, op.filename)
    except (SpecError, ValueError) as e:
        return f"the `kope:` header does not parse: {e}", True
    if [_norm(k) for k in spec.kernels] != [_norm(k) for k in op.kernels]:
        want, got = "; ".join(op.kernels), "; ".join(spec.kernels)
        return f"the kernel prototypes must stay exactly as declared: want `{want}`, got `{got}`", True
    body = "\n".join(line for line in source.splitlines() if not _KOPE_LINE.match(line))
    missing = [f for f in map(_fname, op.kernels) if f and not re.search(rf"\b{re.escape(f)}\s*\(", body)]
    if missing:
        return f"the source declares but never defines {', '.join(missing)}", True
    refused = screen(ctx, body)
    if refused:
        return f"the source is refused: {'; '.join(refused[:5])}", True
    cand = Candidate(
        source=scrub(source),
        filename=op.filename,
        toolchain=op.toolchain,
        params=dict(spec.space.defaults),
        idea=scrub(" ".join(idea.split()))[:300],
        agent=agent,
        parent=ctx.incumbent.candidate.hash,
    )
    known = {c.hash for c in accepted} | {ctx.incumbent.candidate.hash, ctx.baseline.candidate.hash}
    if cand.hash in known or _seen(ctx, cand.hash):
        return f"{cand.short} was already tried (same source and params): submit a different idea", True
    accepted.append(cand)
    note = f" ({'; '.join(notes)})" if notes else ""
    return (
        f"accepted as {cand.short} ({len(accepted)}/{n}), built with {json.dumps(cand.params)}{note}",
        False,
    )


def compile_check(ctx: Context, source: str, timeout: float, cc: str | None) -> str:
    """The `compile_draft` tool: the compiler's verdict on a draft, built in the judge's sandbox."""
    filename = Path(ctx.operator.filename).name or "draft.c"
    lang = prompt.language(filename)
    if lang == "python":
        try:
            compile(source, filename, "exec")
        except SyntaxError as e:
            return f"{filename}:{e.lineno}:{e.offset}: SyntaxError: {e.msg}"
        return "ok (Python syntax only; the judge builds and runs it)"
    if ctx.operator.toolchain != "c" or lang not in ("c", "cpp"):
        return f"no quick check for {filename} here; submit it and the judge builds it"
    # built in the judge's sandbox with the toolchain's own command line: see judge/controller/draft.py
    checked = draft.check(source, filename, timeout, cc)
    if checked.reason:
        return checked.reason
    output = prompt.clip(checked.output, COMPILER_CHARS)
    fenced = prompt.untrusted(output, "compiler output for your draft") if output else ""
    return ("ok\n" + fenced).strip() if checked.ok else fenced


def merge_space(source: str, space: str, filename: str, notes: list[str]) -> str:
    """`source` with the `kope:` param/flags/require lines of `space` added to its header.

    An axis the source already declares is kept as the source has it (noted in `notes`).
    """
    declared = parse_spec(source, filename).space
    new: list[str] = []
    for raw in space.splitlines():
        body = re.sub(r"^\s*(?://+|#+|/\*+|\*+)?\s*(?:kope:)?\s*", "", raw).removesuffix("*/").strip()
        if not body:
            continue
        word, _, rest = body.partition(" ")
        if word not in ("param", "flags", "require"):
            raise ValueError(
                f"tuning_space line {raw.strip()!r}: only param, flags and require lines belong there"
            )
        axis = FLAGS if word == "flags" else rest.partition("=")[0].strip() if word == "param" else None
        if (axis and axis in declared.axes) or (word == "require" and rest.strip() in declared.requires):
            notes.append(f"kept the source's own declaration of {axis or rest.strip()}")
            continue
        new.append(f"{_comment(filename)} kope: {body}\n")
    lines = source.splitlines(keepends=True)
    at = max((i + 1 for i, line in enumerate(lines) if _KOPE_LINE.match(line)), default=0)
    if at and not lines[at - 1].endswith("\n"):
        lines[at - 1] += "\n"
    return "".join(lines[:at] + new + lines[at:])


def compile_problem(ctx: Context, source: str, timeout: float, cc: str | None) -> str:
    """'' when a draft compiles (or has no quick check here), else what the compiler or screen said."""
    said = compile_check(ctx, source, timeout, cc)
    return "" if said.startswith(("ok", "no quick check")) else said


def fenced_candidates(text: str) -> list[dict[str, str]]:
    """The candidates of a plain-text reply: each fenced code block with the `Idea:` line before it
    and a following block tagged `kope` as its tuning space (submit_candidate's fields)."""
    found: list[dict[str, str]] = []
    at = 0
    for m in _FENCED.finditer(text or ""):
        tag, body = m.group(1).lower(), m.group(2)
        before = text[at : m.start()]
        at = m.end()
        if tag == "kope" and found and not before.strip():
            found[-1]["tuning_space"] = body
            continue
        if tag == "kope" or not body.strip():
            continue
        ideas = _IDEA.findall(before)
        idea = ideas[-1] if ideas else next((x for x in before.splitlines() if x.strip()), "")
        found.append({"source": body, "idea": idea.strip(" *:#-") or "(no idea given)"})
    return found


def unfenced_candidate(text: str, kernels: tuple[str, ...], filename: str) -> list[dict[str, str]]:
    """A plain-text reply that holds a whole kernel source without a code fence (small models often
    write one): the lines from its first `kope:` line, preprocessor line or kernel definition to the
    last closing brace, as one candidate, when that span defines every declared kernel function. The
    checks `submit` makes (the prototypes, the screen) and a sandboxed compile still decide."""
    if "```" in (text or "") or prompt.language(filename) not in ("c", "cpp", "cuda"):
        return []
    lines = (text or "").splitlines()
    names = [f for f in map(_fname, kernels) if f]
    start = next(
        (i for i, line in enumerate(lines) if _CODE_START.match(line) or _defines(line, names)), None
    )
    end = max((i for i, line in enumerate(lines) if line.rstrip().endswith("}")), default=-1)
    if start is None or end <= start:
        return []
    source = "\n".join(lines[start : end + 1]) + "\n"
    if not names or not all(re.search(rf"\b{re.escape(f)}\s*\([^;{{]*\)\s*\{{", source) for f in names):
        return []
    ideas = _IDEA.findall("\n".join(lines[:start]))
    return [{"source": source, "idea": ideas[-1].strip(" *:#-") if ideas else "(no idea given)"}]


def _defines(line: str, names: list[str]) -> bool:
    return any(re.match(rf"^\s*[A-Za-z_][\w \t*]*\b{re.escape(f)}\s*\(", line) for f in names)


def _seen(ctx: Context, digest: str) -> bool:
    try:
        return bool(ctx.seen(digest))
    except Exception:  # an unreadable graph cannot veto a candidate
        return False


def _norm(prototype: str) -> str:
    return re.sub(r"\s*([*,()\[\]])\s*", r"\1", " ".join(prototype.rstrip("; ").split()))


def _fname(prototype: str) -> str:
    m = re.search(r"([A-Za-z_]\w*)\s*\(", prototype)
    return m.group(1) if m else ""


def _comment(filename: str) -> str:
    return "#" if prompt.language(filename) == "python" else "//"


def screen(ctx: Context, body: str) -> list[str]:
    """The operator's toolchain's own source screen, run early so the model hears why at once."""
    op = ctx.operator
    if op.screen is None:
        return []
    return list(op.screen(Candidate(body, Path(op.filename).name, op.toolchain)))


def needs(field: str) -> str:
    """The error a tool call gets for a missing or empty field."""
    return f"`{field}` must be a non-empty string"
