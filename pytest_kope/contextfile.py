"""`kope context OP [--agent claude|openai:MODEL] [--context N] [--repo DIR] [pytest args]`: see what
the model sees.

Prints the prompt the LLM agent would open its first round for operator OP with, now: the system
prompt, the static block (kernel, tests, contract, hardware) and the dynamic block with the experience
recalled from the repo's graph, and for each recalled lesson or attempt why it was picked (score,
similarity, value, relevance, operator and hardware match), the tokens it used out of the recall
budget, and what was left out. The prompt is made by the run's own function (agents/llm/opening.py),
fitted to the model's context with the run's token counter: the context is `--context`, else
kope_llm_context, else (for `openai:MODEL` with a base URL set) what the server says of itself, as a
run asks it; no prompt is sent anywhere, and no key is needed. The timings of the committed kernel
appear in a run's prompt once the run has measured them; here they are absent.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .agents.llm.calls import RECALL_TOKENS
from .memory import recall_from

if TYPE_CHECKING:
    from .agents.base import Context
    from .agents.llm.fit import Counter, Window
    from .memory.recall import Recall
    from .operator import Operator
    from .settings import LlmSettings, Settings

USAGE = "kope context OPERATOR [--agent claude|openai:MODEL] [--context N] [--repo DIR] [pytest args]"


def main(argv: Sequence[str]) -> int:
    """Print the prompt record for the operator; 2 when it cannot be made."""
    parser = argparse.ArgumentParser(prog="kope context", usage=USAGE, description=__doc__.split("\n\n")[1])
    parser.add_argument("operator", help="the operator (the `kope` marker's name)")
    parser.add_argument("--agent", default="claude", help="claude[:MODEL] or openai:MODEL (default claude)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the operator repo (default .)")
    parser.add_argument("--db", type=Path, help="experience graph (default REPO/.kope/experience.db)")
    parser.add_argument(
        "--context", type=int, help="the model's context in tokens (default: as a run finds it)"
    )
    args, rest = parser.parse_known_args(list(argv))
    found = Finder(args.operator, args.agent, args.db or args.repo / ".kope" / "experience.db", args.context)
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        # --assert=plain: this process imported pytest_kope before pytest could mark it for rewriting,
        # which a repo's `filterwarnings = error` turns into a failure; collecting needs no rewriting
        code = pytest.main(
            ["--collect-only", "-q", "--assert=plain", "-p", "no:cacheprovider", str(args.repo), *rest],
            plugins=[found],
        )
    if found.text is None:  # pytest's own output too when collection failed: it says why
        why = found.error or f"pytest could not collect {args.repo} (exit {code})"
        tail = (
            said.getvalue()[-2000:]
            if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
            else ""
        )
        print(f"kope context: {why}\n{tail}".rstrip(), file=sys.stderr)
        return 2
    print(found.text, end="")
    return 0


class Finder:
    """A pytest plugin: after collection, the prompt record of the named operator."""

    def __init__(self, operator: str, agent: str, db: Path, context: int | None = None):
        self.operator, self.agent, self.db, self.context = operator, agent, db, context
        self.text: str | None = None
        self.error = ""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        from .errors import KopeError
        from .operator import operator_of

        found = [(item, op) for item in items if (op := operator_of(item))]
        mine = [(item, op) for item, op in found if op.name == self.operator]
        if not mine:
            names = sorted({op.name for _, op in found})
            self.error = f"no operator {self.operator!r} in {config.rootpath}" + (
                f" (it has {', '.join(names)})" if names else " (no test carries a kope marker)"
            )
            return
        try:
            self.text = self._prompt(config, mine)
        except KopeError as e:
            self.error = str(e)

    def _prompt(self, config: pytest.Config, mine: list[tuple[pytest.Item, Operator]]) -> str:
        from .agents.base import Context
        from .agents.llm.fit import Counter, Window
        from .agents.llm.opening import Asked, fitted
        from .agents.llm.record import text
        from .judge.outcome import Judged, Outcome
        from .settings import LlmSettings, Settings
        from .toolchains import toolchain_of

        op = mine[0][1]
        tc = toolchain_of(config, op.toolchain)
        files = sorted({Path(str(item.path)) for item, _ in mine})
        info = op.info({str(f): f.read_text() for f in files})
        hw = tc.fingerprint()
        base = Judged(op.baseline(), Outcome.OK, speedup=1.0)
        s, llm = Settings.from_config(config), LlmSettings.from_config(config)
        ctx = Context(info, hw, base, base, [base], s.budget, recall=lambda **kw: None, seen=lambda h: False)
        kind, _, model = self.agent.partition(":")
        window, counter = Window(None, llm.output), Counter()
        plain = self._server(kind, model, window, counter, ctx, llm)
        asked = Asked(ctx, first_round(s), self._recall(ctx), plain=plain)
        made = fitted(asked, counter, window, RECALL_TOKENS)
        head = {"operator": op.name, "round": 1, "agent": kind, "provider": PROVIDERS.get(kind, kind)}
        return text({**head, "model": model or _default_model(kind), "plain": plain, **made})

    def _server(
        self, kind: str, model: str, window: Window, counter: Counter, ctx: Context, llm: LlmSettings
    ) -> bool:
        """The context the run would fit to, as the run learns it (the setting, else the server's
        own word, asked as a run asks); whether the run would start on the plain-text protocol."""
        from .agents.llm import openai_endpoint, prompt
        from .agents.llm.provider_openai import OpenAIProvider

        given = self.context or llm.context
        if given:
            window.learn(given, "--context" if self.context else "kope_llm_context")
            return False
        key, url = openai_endpoint(llm.openai_key_env, llm.openai_base_url)
        if kind != "openai" or not url:
            return False
        provider = OpenAIProvider(model or "?", key, url, timeout=30)
        try:
            sample = prompt.system(False) + prompt.static_block(ctx.operator, ctx.hardware)
            found = provider.info(sample)
        finally:
            provider.close()
        window.learn(found.context, found.said_by)
        if found.sample_tokens:
            counter.learn(len(sample), found.sample_tokens, "the server's tokenizer")
        return found.tools is False

    def _recall(self, ctx: Context) -> Recall | None:
        """What the agent's first recall finds (the session's recaller, without marking lessons used)."""
        from .agents.llm.prompt import recall_state
        from .memory import Graph
        from .memory.recall import RecallQuery

        if not self.db.is_file():
            return None
        op = ctx.operator
        query = RecallQuery(
            op.name, op.family, ctx.hardware, op.toolchain, recall_state(ctx, []), 12, RECALL_TOKENS
        )
        with Graph(self.db) as graph:
            return recall_from(graph, query)


PROVIDERS = {"claude": "anthropic", "openai": "openai"}


def first_round(s: Settings) -> int:
    """The candidates a run's first round asks for: a batch (session/run.py), within the budget and
    the patience."""
    return min(max(2, s.jobs * 2), s.budget, s.patience or s.budget)


def _default_model(kind: str) -> str:
    import os

    from .agents.llm import DEFAULT_MODEL

    return os.environ.get("KOPE_MODEL") or (DEFAULT_MODEL if kind == "claude" else "(give openai:MODEL)")
