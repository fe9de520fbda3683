"""What the LLM agent has cost, per operator, and the per-operator token budget (--kope-max-tokens).

The budget is per operator so that one hard operator cannot starve the others: when an operator's
budget would not cover the next prompt and a useful reply, the agent stops for that operator only,
and says why (`stopped_for`), which the search loop reports as the reason its search ended.
"""

from __future__ import annotations

import copy
from typing import Any

from ...errors import ConfigError
from .wire import TOKEN_KEYS


class Usage:
    """Calls, tokens (TOKEN_KEYS as the provider reports them), faults, retries and notes."""

    def __init__(self, provider: str, model: str, keys: tuple[str, ...], max_tokens: int | str | None):
        self.max_tokens = token_budget(max_tokens)
        self.keys = keys
        self.data: dict[str, Any] = {
            "provider": provider,
            "model": model,
            "calls": 0,
            **dict.fromkeys(keys, 0),
            "faults": [],
            "notes": [],
            "per_operator": {},
        }
        self.spent: dict[str, str] = {}  # operator -> why the agent proposes nothing more for it

    def per(self, op: str) -> dict[str, Any]:
        per: dict[str, Any] = self.data["per_operator"].setdefault(
            op, {"calls": 0, **dict.fromkeys(self.keys, 0), "candidates": 0}
        )
        return per

    def total(self, op: str) -> int:
        per = self.per(op)
        return sum(int(per.get(k, 0)) for k in TOKEN_KEYS)

    def add(self, op: str, used: dict[str, int]) -> None:
        """One answered call's tokens. A key the provider reports late (a server's cache) is added."""
        for target in (self.data, self.per(op)):
            target["calls"] += 1
            for k, v in used.items():
                target[k] = target.get(k, 0) + v

    def room(self, op: str, estimate: int, wanted: int, least: int) -> int | None:
        """The output tokens the next call may ask for under the operator's budget; None when what is
        left would not cover the prompt and `least` tokens of reply (the agent stops for `op`)."""
        if self.max_tokens is None:
            return wanted
        left = self.max_tokens - self.total(op)
        if left - estimate < least:
            self.spent[op] = (
                f"token budget for {op} spent: {self.total(op)} of {self.max_tokens} tokens used,"
                f" ~{estimate} more needed for the next call (--kope-max-tokens)"
            )
            self.data["notes"].append(self.spent[op])
            return None
        return min(wanted, left - estimate)

    def note(self, key: str, text: str) -> None:
        items: list[str] = self.data.setdefault(key, [])
        if text not in items:
            items.append(text[:600])

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self.data)


def token_budget(given: int | str | None) -> int | None:
    """--kope-max-tokens (an ini value arrives as a string); None: no budget."""
    try:
        return None if given is None or given == "" else int(given)
    except (TypeError, ValueError):
        raise ConfigError(f"--kope-max-tokens needs a whole number of tokens, got {given!r}") from None
