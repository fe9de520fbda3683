"""The LLM agent: writes new kernels with a model, whatever the provider (wire.py, provider_*.py).

Each proposal round is a fresh, bounded conversation: the cached static block (operator source, tests,
contract, hardware) plus this round's incumbent, verdicts, a one-line-each summary of earlier rounds and
the recalled experience within a fixed token budget. The model answers with tool calls
(`query_experience`, `compile_draft`, `submit_candidate`) until it has submitted `n` candidates or the
round's turn limit is reached. A model served without tool calls gets the plain-text protocol: its
candidates come as fenced code blocks and go through the same checks, a sandboxed compile first.

Nothing the API does crashes the run: rate limits, overload and time-outs are retried with back-off, a
prompt over the model's context length is shrunk once, and whatever still fails ends the round with a
fault note in `usage()["faults"]`. The key never leaves the HTTP header: it is scrubbed from every text
this agent stores or returns. Drafts compile in the judge's sandbox (judge/controller/draft.py), and whatever text
came from a candidate (compiler output, build logs, test failures) reaches the model fenced as untrusted.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from ...candidate import Candidate
from ...judge.outcome import Judged
from ...memory.recall import CHARS_PER_TOKEN
from ...review.forge import redact
from ..base import AgentBase, Context, PromptSink, Sink
from . import prompt, record
from .tools import _needs, compile_check, compile_problem, fenced_candidates, submit
from .usage import Usage
from .wire import TOKEN_KEYS, CallError, Provider, Reply, ToolCall, ToolResult, Turn

_KEY_LIKE = re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{6,}|\bsk-[A-Za-z0-9_\-]{20,}")
RECALL_TOKENS = 1_500  # experience in a round's prompt; `kope context` shows the same


@dataclass(frozen=True)
class Limits:
    """How far one round goes: retries and their back-off, tool turns, the output tokens asked for,
    the recall's and a query's token shares, and a draft's compile check (time limit, compiler)."""

    max_retries: int = 4
    retry_delay: float = 1.0
    max_retry_delay: float = 30.0
    max_turns: int = 6
    max_output_tokens: int = 8_192
    min_output_tokens: int = 1_024
    recall_tokens: int = RECALL_TOKENS
    query_tokens: int = 1_000
    compile_timeout: float = 20.0
    cc: str | None = None


class LlmAgent(AgentBase):
    """Proposes new kernel sources written by a model; see the module docstring."""

    def __init__(
        self,
        provider: Provider,
        name: str,
        max_tokens: int | str | None = None,
        graph_sink: Sink | None = None,
        limits: Limits = Limits(),
    ):
        self.provider, self.name, self.model = provider, name, provider.model
        keys = TOKEN_KEYS if provider.name == "anthropic" else TOKEN_KEYS[:2]
        self.budget = Usage(provider.name, provider.model, keys, max_tokens)
        self.max_tokens = self.budget.max_tokens
        self.graph_sink = graph_sink
        self.prompt_sink: PromptSink | None = None  # the session writes each round's record to the run folder
        self.limits = limits
        self.plain = False  # the server answered that it does no tool calls: the plain-text protocol
        self._last: dict[str, list[Judged]] = {}  # operator -> verdicts on its last round
        self._earlier: dict[str, list[str]] = {}  # operator -> one line per earlier verdict
        self._stopped: str | None = None  # why this agent proposes nothing more at all (auth, model)
        self._rounds: dict[str, int] = {}  # operator -> rounds opened (numbers its prompt records)
        self._round_input = 0

    # -- the Agent protocol ------------------------------------------------------------------------

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        if n <= 0 or self._stopped or ctx.operator.name in self.budget.spent:
            return []
        try:
            return self._round(ctx, n)
        except Exception as e:  # a bug here must not end the user's run; it is reported as a fault
            self._fault(ctx.operator.name, f"internal error: {type(e).__name__}: {e}")
            return []

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        op = ctx.operator.name
        earlier = self._earlier.setdefault(op, [])
        earlier += [prompt.one_line(j) for j in self._last.get(op, [])]
        del earlier[: -prompt.HISTORY_LINES]
        self._last[op] = list(results)

    def usage(self) -> dict[str, Any]:
        return self.budget.snapshot()

    def stopped_for(self, op: str) -> str | None:
        """Why the agent proposes nothing more for `op` (its token budget is spent), or None."""
        return self.budget.spent.get(op)

    def close(self) -> None:
        self.provider.close()

    # -- one round ---------------------------------------------------------------------------------

    def _round(self, ctx: Context, n: int) -> list[Candidate]:
        op = ctx.operator
        self._rounds[op.name] = self._rounds.get(op.name, 0) + 1
        state = prompt.recall_state(ctx, self._last.get(op.name, []))
        opening = Opening(self, ctx, n, self._found(ctx, state, self.limits.recall_tokens))
        turns = [opening.turn()]
        accepted: list[Candidate] = []
        nudged = False
        self._round_input = 0
        for _ in range(self.limits.max_turns):
            reply = self._call(ctx, turns, opening)
            if reply is None:
                break
            cut = reply.stop == "max_tokens"
            if not reply.calls and fenced_candidates(reply.text):  # the plain-text protocol
                turns.append(Turn("assistant", text=reply.text))
                answer = self._plain_submit(ctx, reply.text, accepted, n, cut)
                if len(accepted) >= n:
                    break
                turns.append(Turn("user", parts=[answer]))
            elif not reply.calls:
                if reply.stop == "refusal" or nudged:
                    why = "the model refused" if reply.stop == "refusal" else "a reply without a candidate"
                    self._fault(
                        op.name, f"{why} after a reminder; round ended" if nudged else f"{why}; round ended"
                    )
                    break
                nudged = True
                self._nudge(op.name, turns, reply)
            else:
                turns.append(Turn("assistant", text=reply.text, calls=reply.calls))
                results = [self._tool(ctx, call, accepted, n, cut) for call in reply.calls]
                if len(accepted) >= n:
                    break
                turns.append(Turn("tools", results=results))
        else:
            if not accepted:
                self._fault(
                    op.name, f"no candidate accepted within {self.limits.max_turns} turns; round ended"
                )
        self.budget.per(op.name)["candidates"] += len(accepted)
        return accepted

    def _nudge(self, op: str, turns: list[Turn], reply: Reply) -> None:
        """A reminder to answer with a candidate; an empty assistant turn cannot go back to the API,
        so after one the reminder joins the last user turn."""
        nudge = prompt.PLAIN_NUDGE if self.plain else prompt.NUDGE
        if reply.text.strip():
            turns += [Turn("assistant", text=reply.text), Turn("user", parts=[nudge])]
        else:
            self._fault(op, "the model sent an empty reply; reminded it once")
            turns[-1].parts.append(nudge)

    def _call(self, ctx: Context, turns: list[Turn], opening: Opening) -> Reply | None:
        """One call with retries; None (and a fault noted) when it cannot be had."""
        op = ctx.operator.name
        attempt = 0
        while True:
            max_out = self._output_room(op, turns)
            if max_out is None:
                return None
            tries = f"after {attempt + 1} tries" if attempt else "on the first try"
            try:
                reply = self.provider.send(prompt.system(self.plain), turns, max_out, not self.plain)
            except CallError as e:
                if not self._recover(op, e, turns, opening, attempt, tries):
                    return None
                attempt += 1
                continue
            self._record(op, reply)
            return reply

    def _recover(
        self, op: str, e: CallError, turns: list[Turn], opening: Opening, attempt: int, tries: str
    ) -> bool:
        """Whether the call is worth another try after `e` (after a back-off, a shrink or a switch)."""
        what = self._scrub(e.what)
        if e.kind == "stop":
            self._stopped = what
            self._fault(op, f"{what}; the {self.name} agent stops")
            return False
        if e.kind == "no_tools" and not self.plain:
            self.plain = True
            self.budget.note("notes", f"{what}: the model gets the plain-text protocol from now on")
            turns[0] = opening.turn()
            return True
        if e.kind == "context" and not opening.shrunk:
            opening.shrunk = True
            self.budget.note("retries", f"{op}: {what}; recalled context halved, earlier rounds dropped")
            turns[0] = opening.turn()
            return True
        if e.kind != "retry" or attempt >= self.limits.max_retries:
            self._fault(op, f"{what} {tries}; round ended")
            return False
        delay = self._delay(attempt, e.retry_after)
        self.budget.data.setdefault("retries", []).append(
            f"{op}: {self._scrub(e.short)}, retried in {delay:.1f} s"
        )
        time.sleep(delay)
        return True

    def _output_room(self, op: str, turns: list[Turn]) -> int | None:
        """The output tokens this call may ask for under the operator's token budget (usage.py)."""
        chars = len(json.dumps([t.__dict__ for t in turns], default=str)) + len(prompt.SYSTEM)
        est = max(self._round_input, (chars + len(json.dumps(prompt.TOOLS))) // CHARS_PER_TOKEN)
        return self.budget.room(op, est, self.limits.max_output_tokens, self.limits.min_output_tokens)

    def _delay(self, attempt: int, asked: float | None) -> float:
        if asked is not None:
            return min(asked, max(self.limits.max_retry_delay, 60.0))
        return min(self.limits.retry_delay * 2.0**attempt, self.limits.max_retry_delay) * random.uniform(
            0.75, 1.0
        )

    # -- tools -------------------------------------------------------------------------------------

    def _tool(self, ctx: Context, call: ToolCall, accepted: list[Candidate], n: int, cut: bool) -> ToolResult:
        inp = call.input
        if call.name == "submit_candidate":
            text, error = submit(ctx, inp, accepted, n, self._scrub, self.name)
        elif call.name == "query_experience":
            question = inp.get("question")
            if isinstance(question, str) and question.strip():
                text, error = self._recall(ctx, question, self.limits.query_tokens), False
            else:
                text, error = _needs("question"), True
        elif call.name == "compile_draft":
            source = inp.get("source")
            if isinstance(source, str) and source.strip():
                text, error = compile_check(ctx, source, self.limits.compile_timeout, self.limits.cc), False
            else:
                text, error = _needs("source"), True
        else:
            text = f"unknown tool {call.name!r}: use submit_candidate, query_experience or compile_draft"
            error = True
        if error and cut:
            text += " (your reply was cut off at the output-token limit: send a shorter source)"
        return ToolResult(call.id, call.name, self._scrub(text), error)

    def _plain_submit(self, ctx: Context, said: str, accepted: list[Candidate], n: int, cut: bool) -> str:
        """The candidates of a plain-text reply, each compiled in the sandbox, then checked as
        submit_candidate checks them; what happened to each, for the model."""
        answers = []
        for i, fields in enumerate(fenced_candidates(said)[: n - len(accepted) or 1], 1):
            problem = compile_problem(ctx, fields["source"], self.limits.compile_timeout, self.limits.cc)
            if problem:
                answers.append(f"candidate {i}: refused by the sandboxed compile check: {problem}")
                continue
            text, error = submit(ctx, fields, accepted, n, self._scrub, self.name)
            answers.append(f"candidate {i}: {'refused: ' if error else ''}{text}")
        if cut:
            answers.append("(your reply was cut off at the output-token limit: send a shorter source)")
        return self._scrub("\n".join(answers))

    def _found(self, ctx: Context, state: str, budget: int) -> Any:
        try:
            return ctx.recall(state=state, budget=budget)
        except Exception as e:  # the graph is advice: a failing recall costs the advice, not the round
            self._fault(ctx.operator.name, f"recall failed: {type(e).__name__}: {e}")
            return None

    def _recall(self, ctx: Context, state: str, budget: int) -> str:
        return experience(self._found(ctx, state, budget), budget)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _record(self, op: str, reply: Reply) -> None:
        self.budget.add(op, reply.usage)
        for note in reply.notes:
            self.budget.note("notes", self._scrub(note))
        self._round_input = max(
            self._round_input, sum(v for k, v in reply.usage.items() if k != "output_tokens")
        )
        if self.graph_sink is not None:
            try:
                self.graph_sink(op, self.model, dict(reply.usage))
            except Exception as e:  # bookkeeping must not end the round
                self._fault(op, f"recording usage failed: {type(e).__name__}: {e}")

    def _fault(self, op: str, text: str) -> None:
        self.budget.data["faults"].append(self._scrub(f"{op}: {text}")[:600])

    def _scrub(self, text: str) -> str:
        return _KEY_LIKE.sub("***", redact(text, *self.provider.secrets))


def experience(found: Any, budget: int) -> str:
    """Recalled experience as the prompt shows it: within its budget, fenced (lessons and attempts
    quote earlier candidates' failures and build logs)."""
    text = "" if found is None else str(found.render(budget))
    text = prompt.clip(text, budget * CHARS_PER_TOKEN)
    if not text.strip():
        return "(nothing relevant recorded yet)"
    return prompt.untrusted(text, "experience graph: lessons and results of earlier candidates")


def prompt_record(
    ctx: Context, n: int, found: Any, budget: int, last: list[Judged], earlier: list[str], plain: bool
) -> dict[str, Any]:
    """A round's opening prompt as sent (system, static and dynamic blocks) and why its recalled
    experience is what it is: what the agent sends and `kope context` prints."""
    shown = experience(found, budget)
    return {
        "system": prompt.system(plain),
        "static": prompt.static_block(ctx.operator, ctx.hardware),
        "dynamic": prompt.dynamic_block(ctx, n, last, earlier, shown, plain),
        "recall": record.explain(found, budget, shown),
    }


class Opening:
    """A round's first user turn: the static and dynamic blocks, rebuilt smaller after a
    context-length error (half the recall budget, no earlier rounds) or for the plain protocol;
    each version sent is recorded (record.py)."""

    def __init__(self, agent: LlmAgent, ctx: Context, n: int, found: Any):
        self.agent, self.ctx, self.n, self.found = agent, ctx, n, found
        self.shrunk = False

    def turn(self) -> Turn:
        a, ctx, op = self.agent, self.ctx, self.ctx.operator.name
        made = prompt_record(
            ctx,
            self.n,
            self.found,
            a.limits.recall_tokens // 2 if self.shrunk else a.limits.recall_tokens,
            a._last.get(op, []),
            [] if self.shrunk else a._earlier.get(op, []),
            a.plain,
        )
        if a.prompt_sink is not None:
            head = {
                "operator": op,
                "round": a._rounds.get(op, 0),
                "agent": a.name,
                "provider": a.provider.name,
            }
            self._write({**head, "model": a.model, "plain": a.plain, "shrunk": self.shrunk, **made})
        return Turn("user", parts=[made["static"], made["dynamic"]])

    def _write(self, made: dict[str, Any]) -> None:
        a = self.agent
        try:
            assert a.prompt_sink is not None
            a.prompt_sink(json.loads(a._scrub(json.dumps(made, default=str))))
        except Exception as e:  # an unwritable run folder costs the record, not the round
            a._fault(self.ctx.operator.name, f"writing the prompt record failed: {type(e).__name__}: {e}")
