"""A round's opening prompt, fitted to the model's context: what the agent sends and `kope context`
prints, made by the same function with the same token counter.

`fitted` builds the system prompt, the static block and the dynamic block at each step of the size
ladder (fit.py) until the whole opening fits the room the context leaves for it. The record it returns
holds the prompt as sent, why the recalled experience is what it is (record.py), and how it was fitted.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from typing import Any

from ...judge.outcome import Judged
from ...memory.recall import CHARS_PER_TOKEN, Recall
from ..base import Context
from . import prompt, record
from .fit import LADDER, MESSAGE_TOKENS, Counter, Sizes, Window


def experience(found: Recall | None, budget: int, shown: tuple[str, ...] = ()) -> str:
    """Recalled experience as the prompt shows it: within its budget, fenced (lessons and attempts
    quote earlier candidates' failures and build logs), without a source the prompt already holds
    (`shown`: the committed kernel, the incumbent)."""
    if found is not None and shown and getattr(found, "exemplars", None):
        found = copy.copy(found)
        found.exemplars = [_without(ex, shown) for ex in found.exemplars]
    text = "" if found is None or budget <= 0 else str(found.render(budget))
    text = prompt.clip(text, budget * CHARS_PER_TOKEN)
    if not text.strip():
        return "(nothing relevant recorded yet)"
    return prompt.untrusted(text, "experience graph: lessons and results of earlier candidates")


def _without(ex: dict[str, Any], shown: tuple[str, ...]) -> dict[str, Any]:
    source = ex.get("source")
    if not source or source.strip() not in shown:
        return ex
    return {**ex, "source": None, "idea": (ex.get("idea") or "") + " (its source is shown above)"}


@dataclass(frozen=True)
class Asked:
    """What a round's opening is made of: the operator's state, the candidates asked for, what recall
    found, the verdicts on the last round and one line per earlier one, and the protocol."""

    ctx: Context
    n: int
    found: Recall | None
    last: list[Judged] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)
    plain: bool = False


def prompt_record(asked: Asked, sizes: Sizes, counter: Counter) -> dict[str, Any]:
    """A round's opening prompt at `sizes`: system, static and dynamic blocks, the recall explained,
    and its tokens by `counter` (the tool schemas counted when the model gets tools)."""
    ctx, found, plain = asked.ctx, asked.found, asked.plain
    op = ctx.operator
    sources = tuple(dict.fromkeys(s.strip() for s in (op.source, ctx.incumbent.candidate.source)))
    shown = experience(found, sizes.recall_tokens, sources) if sizes.recall_tokens else ""
    made: dict[str, Any] = {
        "system": prompt.system(plain),
        "static": prompt.static_block(op, ctx.hardware, sizes),
        "dynamic": prompt.dynamic_block(ctx, asked.n, asked.last, asked.earlier, shown, plain, sizes),
        "recall": record.explain(found if sizes.recall_tokens else None, sizes.recall_tokens, shown),
    }
    tools = "" if plain else json.dumps(prompt.TOOLS)
    parts = (made["system"], made["static"], made["dynamic"], tools)
    made["fit"] = {
        "prompt_tokens": sum(counter(part) for part in parts) + 2 * MESSAGE_TOKENS,
        "level": sizes.level,
        "counter": counter.said(),
        "chars_per_token": counter.chars_per_token,
    }
    return made


def fitted(
    asked: Asked, counter: Counter, window: Window, recall_cap: int, first_level: int = 0
) -> dict[str, Any]:
    """The opening at the first step of the ladder (from `first_level`) that fits `window`, recall
    at most `recall_cap` tokens; `fit` says how, and `fits` is False when not even the last step
    does (no call should be made)."""
    room = window.prompt_room(counter(asked.ctx.operator.source))
    made: dict[str, Any] = {}
    for sizes in LADDER[min(first_level, len(LADDER) - 1) :]:
        sizes = replace(sizes, recall_tokens=min(sizes.recall_tokens, recall_cap))
        made = prompt_record(asked, sizes, counter)
        if room is None or made["fit"]["prompt_tokens"] <= room:
            break
    tokens = made["fit"]["prompt_tokens"]
    made["fit"].update(
        context=window.context,
        context_from=window.said_by or None,
        prompt_room=room,
        reply_tokens=window.output_room(tokens),
        fits=room is None or tokens <= room,
    )
    return made


def too_big(made: dict[str, Any], window: Window) -> str:
    """Why a prompt that does not fit is not sent, in one line."""
    fit = made["fit"]
    return (
        f"the model's {window.said()} cannot hold the smallest prompt ({fit['prompt_tokens']} tokens:"
        f" the rules and the kernel source) and a reply of a whole kernel; serve the model with a larger"
        f" context (llama.cpp: -c 8192) or use a model with one"
    )
