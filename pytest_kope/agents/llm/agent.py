"""The LLM agent: writes new kernels with a model, whatever the provider (wire.py, provider_*.py).

Each proposal round is a fresh, bounded conversation: the static block (operator source, tests,
contract, hardware) plus this round's incumbent, verdicts, a one-line-each summary of earlier rounds and
the recalled experience, fitted to the model's context (opening.py). The model answers with tool calls
(`query_experience`, `compile_draft`, `submit_candidate`) until it has submitted `n` candidates or the
round's turn limit is reached. A model served without tool calls (the server says so, answers 400
about tools, or answers a tool request in prose) gets the plain-text protocol: its candidates come as
code blocks, or as a whole source without a fence, and go through the same checks, a sandboxed
compile first.

Every call has a time limit (calls.py): the request time-out, within what the run's time budget
leaves; one that runs out is closed and retried with back-off, Ctrl-C (`cancel`) ends it at once and
no call or round follows. Nothing the API does crashes the run: whatever still fails ends the round
with a fault note in `usage()["faults"]`. The key never leaves the HTTP header: it is scrubbed from
every text this agent stores or returns. Drafts compile in the judge's sandbox
(judge/controller/draft.py), and whatever text came from a candidate (compiler output, build logs,
test failures) reaches the model fenced as untrusted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ...candidate import Candidate
from ...judge.outcome import Judged
from ...memory.recall import Recall
from ...review.forge import redact
from ..base import AgentBase, Context, LineSink, PromptSink, Sink
from . import prompt
from .calls import Calls, Limits
from .fit import Counter, Window
from .opening import Asked, experience, fitted, too_big
from .tools import compile_check, compile_problem, fenced_candidates, needs, submit, unfenced_candidate
from .usage import Usage
from .wire import TOKEN_KEYS, Provider, Reply, ToolCall, ToolResult, Turn

REMINDED = "no candidate in the reply: reminded once"
_KEY_LIKE = re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{6,}|\bsk-[A-Za-z0-9_\-]{20,}")


class LlmAgent(AgentBase):
    """Proposes new kernel sources written by a model; see the module docstring."""

    def __init__(
        self,
        provider: Provider,
        name: str,
        max_tokens: int | str | None = None,
        graph_sink: Sink | None = None,
        limits: Limits | None = None,
    ):
        self.provider, self.name, self.model = provider, name, provider.model
        keys = TOKEN_KEYS if provider.name == "anthropic" else TOKEN_KEYS[:2]
        self.budget = Usage(provider.name, provider.model, keys, max_tokens)
        self.max_tokens = self.budget.max_tokens
        self.graph_sink = graph_sink
        self.prompt_sink: PromptSink | None = None  # the session writes each record to the run folder
        self.line_sink: LineSink | None = None  # the session prints a long call's progress
        self.limits = limits = limits or Limits()
        self.plain = False  # the server does no tool calls: the plain-text protocol
        self.tools_seen = False  # the model has made a tool call: never switched to plain text
        self.server_tools: bool | None = None  # what the server says of its tool calls (None: nothing)
        self.window = Window(None, limits.max_output_tokens)
        self.counter = Counter()
        self.calls = Calls(self)
        self._asked = False  # the server was asked for its context and tool support
        self._last: dict[str, list[Judged]] = {}  # operator -> verdicts on its last round
        self._earlier: dict[str, list[str]] = {}  # operator -> one line per earlier verdict
        self.halted: str | None = None  # why this agent proposes nothing more at all (auth, Ctrl-C)
        self.rounds: dict[str, int] = {}  # operator -> rounds opened (numbers its records)

    # -- the Agent protocol ------------------------------------------------------------------------

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        if self.provider.flight.cancelled and not self.halted:
            self.halted = f"cancelled by {self.provider.flight.cancelled}"
        if n <= 0 or self.halted or ctx.operator.name in self.budget.spent:
            return []
        try:
            return self._round(ctx, n)
        except Exception as e:  # a bug here must not end the user's run; it is reported as a fault
            self.fault(ctx.operator.name, f"internal error: {type(e).__name__}: {e}")
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

    def cancel(self, why: str) -> None:
        """Ctrl-C: the model call in flight ends now (its connection closed), and none follows."""
        self.provider.flight.cancel(why)

    def close(self) -> None:
        self.provider.close()

    # -- one round ---------------------------------------------------------------------------------

    def _round(self, ctx: Context, n: int) -> list[Candidate]:
        op = ctx.operator
        self.rounds[op.name] = self.rounds.get(op.name, 0) + 1
        state = prompt.recall_state(ctx, self._last.get(op.name, []))
        opening = Opening(self, ctx, n, self._found(ctx, state, self.limits.recall_tokens))
        self._ask_server(opening)
        first = opening.turn()
        if first is None:
            return []
        turns = [first]
        accepted: list[Candidate] = []
        nudged = False
        self.calls.begin_round(ctx)
        for _ in range(self.limits.max_turns):
            reply = self.calls.call(op.name, turns, opening)
            if reply is None:
                break
            outcome, end = self._answer(ctx, reply, turns, opening, accepted, n, nudged)
            self.calls.done(outcome)  # the call's record, with what became of the reply
            nudged = nudged or outcome == REMINDED
            if end:
                break
        else:
            if not accepted:
                self.fault(
                    op.name, f"no candidate accepted within {self.limits.max_turns} turns; round ended"
                )
        self.budget.per(op.name)["candidates"] += len(accepted)
        return [] if self.halted else accepted

    def _answer(
        self,
        ctx: Context,
        reply: Reply,
        turns: list[Turn],
        opening: Opening,
        accepted: list[Candidate],
        n: int,
        nudged: bool,
    ) -> tuple[str, bool]:
        """What became of a reply (for its record), and whether the round ends with it: its tool
        calls answered, its plain-text candidates checked, or a reminder (one; then the round ends)."""
        op, cut = ctx.operator, reply.stop == "max_tokens"
        said = fenced_candidates(reply.text) or unfenced_candidate(reply.text, op.kernels, op.filename)
        if reply.calls:
            self.tools_seen = True
            turns.append(Turn("assistant", text=reply.text, calls=reply.calls))
            results = [self._tool(ctx, call, accepted, n, cut) for call in reply.calls]
            turns.append(Turn("tools", results=results))
            told = "\n".join(f"{r.name}: {'refused: ' if r.error else ''}{r.text}" for r in results)
            return told, len(accepted) >= n
        if said:  # the plain-text protocol
            turns.append(Turn("assistant", text=reply.text))
            answer = self._plain_submit(ctx, said, accepted, n, cut)
            turns.append(Turn("user", parts=[answer]))
            return answer, len(accepted) >= n
        if reply.stop == "refusal" or nudged:
            why = "the model refused" if reply.stop == "refusal" else "a reply without a candidate"
            self.fault(op.name, f"{why} after a reminder; round ended" if nudged else f"{why}; round ended")
            return f"{why}: round ended", True
        if (
            self.server_tools is None
            and not self.tools_seen
            and self.to_plain(
                "the model answered a request with tools in prose: the server may ignore `tools`"
            )
        ):
            turns[0] = opening.turn() or turns[0]
        self._nudge(op.name, turns, reply)
        return REMINDED, False

    def _ask_server(self, opening: Opening) -> None:
        """Once: the server's context size, tokenizer and tool support, before the first prompt."""
        if self._asked:
            return
        self._asked = True
        sample = opening.sample()
        info = self.provider.info(sample)
        if self.window.learn(info.context, info.said_by):
            self.budget.note("notes", f"{self.window.said()}: prompts are fitted to it")
        if info.sample_tokens:
            self.counter.learn(len(sample), info.sample_tokens, "the server's tokenizer")
        self.server_tools = info.tools
        if info.tools is False:
            self.to_plain("the server's /props says its chat template does no tool calls")

    def to_plain(self, why: str) -> bool:
        """Switch to the plain-text protocol for the rest of the run; whether it was a switch."""
        if self.plain:
            return False
        self.plain = True
        self.budget.note("notes", f"{self.scrub(why)}: the model gets the plain-text protocol from now on")
        return True

    def _nudge(self, op: str, turns: list[Turn], reply: Reply) -> None:
        """A reminder to answer with a candidate; an empty assistant turn cannot go back to the API,
        so after one the reminder joins the last user turn."""
        nudge = prompt.PLAIN_NUDGE if self.plain else prompt.NUDGE
        if reply.text.strip():
            turns += [Turn("assistant", text=reply.text), Turn("user", parts=[nudge])]
        else:
            self.fault(op, "the model sent an empty reply; reminded it once")
            turns[-1].parts.append(nudge)

    # -- tools -------------------------------------------------------------------------------------

    def _tool(self, ctx: Context, call: ToolCall, accepted: list[Candidate], n: int, cut: bool) -> ToolResult:
        inp = call.input
        if call.name == "submit_candidate":
            text, error = submit(ctx, inp, accepted, n, self.scrub, self.name)
        elif call.name == "query_experience":
            question = inp.get("question")
            if isinstance(question, str) and question.strip():
                found = self._found(ctx, question, self.limits.query_tokens)
                text, error = experience(found, self.limits.query_tokens), False
            else:
                text, error = needs("question"), True
        elif call.name == "compile_draft":
            source = inp.get("source")
            if isinstance(source, str) and source.strip():
                text, error = compile_check(ctx, source, self.limits.compile_timeout, self.limits.cc), False
            else:
                text, error = needs("source"), True
        else:
            text = f"unknown tool {call.name!r}: use submit_candidate, query_experience or compile_draft"
            error = True
        if error and cut:
            text += " (your reply was cut off at the output-token limit: send a shorter source)"
        return ToolResult(call.id, call.name, self.scrub(text), error)

    def _plain_submit(
        self, ctx: Context, said: list[dict[str, str]], accepted: list[Candidate], n: int, cut: bool
    ) -> str:
        """The candidates of a plain-text reply, each compiled in the sandbox, then checked as
        submit_candidate checks them; what happened to each, for the model."""
        answers = []
        for i, fields in enumerate(said[: n - len(accepted) or 1], 1):
            problem = compile_problem(ctx, fields["source"], self.limits.compile_timeout, self.limits.cc)
            if problem:
                answers.append(f"candidate {i}: refused by the sandboxed compile check: {problem}")
                continue
            text, error = submit(ctx, fields, accepted, n, self.scrub, self.name)
            answers.append(f"candidate {i}: {'refused: ' if error else ''}{text}")
        if cut:
            answers.append("(your reply was cut off at the output-token limit: send a shorter source)")
        return self.scrub("\n".join(answers))

    def _found(self, ctx: Context, state: str, budget: int) -> Recall | None:
        try:
            return ctx.recall(state=state, budget=budget)
        except Exception as e:  # the graph is advice: a failing recall costs the advice, not the round
            self.fault(ctx.operator.name, f"recall failed: {type(e).__name__}: {e}")
            return None

    # -- bookkeeping -------------------------------------------------------------------------------

    def fault(self, op: str, text: str) -> None:
        self.budget.data["faults"].append(self.scrub(f"{op}: {text}")[:600])

    def scrub(self, text: str) -> str:
        return _KEY_LIKE.sub("***", redact(text, *self.provider.secrets))

    def asked(self, ctx: Context, n: int, found: Recall | None) -> Asked:
        """What a round's opening turn is made of: the context, this operator's last verdicts and a
        line for each earlier one."""
        op = ctx.operator.name
        return Asked(ctx, n, found, self._last.get(op, []), self._earlier.get(op, []), self.plain)

    def keep(self, record: dict[str, Any]) -> None:
        """A record for the run folder, scrubbed; an unwritable folder costs the record, not the round."""
        if self.prompt_sink is None:
            return
        try:
            where = self.prompt_sink(json.loads(self.scrub(json.dumps(record, default=str))))
            if isinstance(where, (str, Path)):  # the run folder's name for it, for report.md
                self.budget.data.setdefault("records", []).append(str(where))
        except Exception as e:
            self.fault(str(record.get("operator")), f"writing a record failed: {type(e).__name__}: {e}")


class Opening:
    """A round's first user turn, fitted to the model's context (opening.py); rebuilt after a
    context-length error (fitted to what the error said, else one step smaller) or for the plain
    protocol. Each version is recorded, a resend under its own name."""

    def __init__(self, agent: LlmAgent, ctx: Context, n: int, found: Recall | None):
        self.agent, self.ctx, self.n, self.found = agent, ctx, n, found
        self.level = 0  # the first step of the size ladder to try
        self.sent = 0  # versions made (the second and later are resends)
        self.tokens = 0  # the last version's estimate

    def sample(self) -> str:
        """Text like the prompt's, for the server's tokenizer to count."""
        return prompt.system(self.agent.plain) + prompt.static_block(self.ctx.operator, self.ctx.hardware)

    def turn(self) -> Turn | None:
        """The opening turn, or None (a fault said) when not even the smallest one fits."""
        a, ctx, op = self.agent, self.ctx, self.ctx.operator.name
        asked = a.asked(ctx, self.n, self.found)
        made = fitted(asked, a.counter, a.window, a.limits.recall_tokens, self.level)
        self.sent += 1
        self.tokens = made["fit"]["prompt_tokens"]
        head = {"kind": "prompt", "operator": op, "round": a.rounds.get(op, 0), "agent": a.name}
        head |= {"provider": a.provider.name, "model": a.model, "plain": a.plain, "resend": self.sent - 1}
        a.keep({**head, **made})
        if not made["fit"]["fits"]:
            a.fault(op, too_big(made, a.window) + "; round ended")
            return None
        return Turn("user", parts=[made["static"], made["dynamic"]])
