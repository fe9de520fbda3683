"""A prompt that fits the model's context from the start, and a reply that fits what it leaves.

The context size comes from a setting (--kope-llm-context), from the server (serverinfo.py), or from
the numbers of a context-length error; until one is known the prompt has only its fixed ceilings
(prompt.py). Tokens are counted with one `Counter`, the run's and `kope context`'s alike: characters
over characters-per-token, a ratio that starts low (code tokenizes densely: llama.cpp's Gemma
tokenizer makes 2.3 characters a token of C) and only moves lower as the server's own counts are seen
(its tokenizer, a reply's `prompt_tokens`, a context error's numbers), so an estimate errs long.

A prompt is fitted by the `LADDER`: the first of its `Sizes` whose prompt fits the room the context
leaves after a reply big enough for a whole kernel. The committed kernel is never clipped: a context
that cannot hold it, the rules and a reply is said in one line, and no call is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CHARS_PER_TOKEN = 2.5  # the counter's first guess; conservative for code (see above)
LEAST_CHARS_PER_TOKEN = 0.5  # a server's count below it is not about this text
MESSAGE_TOKENS = 8  # each message's role and separators in the chat template
MARGIN = 0.04  # of the context, kept free for what the estimate misses


@dataclass
class Counter:
    """Tokens of a text, estimated; `learn` lowers the ratio when the server counts more."""

    chars_per_token: float = CHARS_PER_TOKEN
    learned_from: str = ""

    def __call__(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)

    def learn(self, chars: int, tokens: int, said_by: str) -> None:
        if tokens <= 0 or chars <= 0:
            return
        ratio = max(LEAST_CHARS_PER_TOKEN, chars / tokens)
        if ratio < self.chars_per_token:
            self.chars_per_token, self.learned_from = round(ratio, 3), said_by

    def said(self) -> str:
        where = f", learned from {self.learned_from}" if self.learned_from else ""
        return f"{self.chars_per_token:g} characters per token{where}"


@dataclass(frozen=True)
class Sizes:
    """How much of each part that can grow a prompt shows (characters, or tokens for recall)."""

    tests_chars: int
    hardware_chars: int
    recall_tokens: int  # 0: no recalled experience
    history_lines: int  # one-line summaries of earlier rounds
    results_shown: int  # verdicts of the last round in detail
    detail_chars: int  # one failure, and one build log
    level: int = 0


LADDER = (
    Sizes(24_000, 2_000, 1_500, 24, 8, 800, 0),
    Sizes(8_000, 800, 800, 10, 4, 400, 1),
    Sizes(3_000, 400, 400, 4, 2, 240, 2),
    Sizes(1_200, 240, 150, 2, 1, 160, 3),
    Sizes(400, 160, 0, 0, 1, 120, 4),
)


@dataclass
class Window:
    """The model's context as known now, and the reply asked for: `output` (--kope-llm-output) at
    most, fitted to what the prompt leaves."""

    context: int | None
    output: int
    said_by: str = ""  # where the context size came from

    def reply_tokens(self, source_tokens: int) -> int:
        """What a fitted prompt leaves for the reply: room for a whole kernel, a quarter more for
        its changes, and its idea, within `output` and at most half the context."""
        want = min(self.output, source_tokens * 5 // 4 + 384)
        return want if self.context is None else min(want, self.context // 2)

    def prompt_room(self, source_tokens: int) -> int | None:
        """Tokens a round's opening prompt may take (None: unknown context, no fitting)."""
        if self.context is None:
            return None
        return self.context - self.reply_tokens(source_tokens) - int(self.context * MARGIN)

    def output_room(self, prompt_tokens: int) -> int:
        """max_tokens for a call whose prompt is `prompt_tokens`: `output`, within what the context
        leaves (may be under what a kernel needs: the caller decides)."""
        if self.context is None:
            return self.output
        return min(self.output, self.context - prompt_tokens - int(self.context * MARGIN))

    def learn(self, context: int | None, said_by: str) -> bool:
        """A context size the server stated; whether it is news."""
        if context and context != self.context:
            self.context, self.said_by = context, said_by
            return True
        return False

    def said(self) -> str:
        if self.context is None:
            return "context size unknown (the server does not say; give kope_llm_context)"
        return f"context {self.context} tokens (from {self.said_by})"
