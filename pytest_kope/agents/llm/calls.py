"""One model call of the LLM agent, with its limits, retries and records.

A call gets the request time-out (--kope-llm-timeout) or what the run's time budget leaves, whichever
is less, and asks for the output tokens that fit what the conversation leaves of the context. It is
retried with back-off on 429/5xx, time-outs and lost connections while time is left; a context-length
error refits the opening to the numbers the server gave and sends it again. Ctrl-C ends it at once
(inflight.py). Every request and what came back (a reply or an error) goes to the run folder as a
call record (record.py); a long call's progress is a line on the terminal.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ...settings import LlmSettings
from ..base import Context, LineSink, Sink
from . import prompt
from .fit import MESSAGE_TOKENS, Counter, Window
from .inflight import InFlight
from .usage import Usage
from .wire import CallError, Provider, Reply, Turn

MAX_RESENDS = 3  # refitted openings sent again after context-length errors, per round
RECALL_TOKENS = 1_500  # experience in a round's prompt at most; `kope context` shows the same


@dataclass(frozen=True)
class Limits:
    """How far one round goes: retries and their back-off, tool turns, a request's time-out and the
    output tokens asked for (fitted to the context), the recall's and a query's token shares, and a
    draft's compile check (time limit, compiler)."""

    max_retries: int = 4
    retry_delay: float = 1.0
    max_retry_delay: float = 30.0
    max_turns: int = 6
    max_output_tokens: int = LlmSettings.output  # fitted to what the prompt leaves (--kope-llm-output)
    min_output_tokens: int = 1_024
    recall_tokens: int = RECALL_TOKENS
    query_tokens: int = 1_000
    compile_timeout: float = 20.0
    cc: str | None = None
    timeout: float = LlmSettings.timeout  # one request, whole (--kope-llm-timeout)
    least_call_s: float = 5.0  # a call is not started with less of the time budget left


class Agent(Protocol):
    """What a call needs of the agent that makes it (agent.py's LlmAgent)."""

    provider: Provider
    name: str
    model: str
    limits: Limits
    window: Window
    counter: Counter
    budget: Usage
    plain: bool
    halted: str | None
    rounds: dict[str, int]
    graph_sink: Sink | None
    line_sink: LineSink | None

    def fault(self, op: str, text: str) -> None: ...

    def scrub(self, text: str) -> str: ...

    def keep(self, record: dict[str, Any]) -> None: ...

    def to_plain(self, why: str) -> bool: ...


class Opening(Protocol):
    """A round's opening turn as a call sees it: rebuilt smaller (`level`) after a context error."""

    ctx: Context
    level: int
    sent: int

    def turn(self) -> Turn | None: ...


class Calls:
    """The agent's calls: `call` one with retries; the round's deadline and its records' numbers."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.deadline: float | None = None  # this round's end (monotonic), from the time budget
        self.op, self.round, self.number = "", 0, 0  # the call in flight, for its records and progress
        self.prompt_tokens = 0
        self.pending: tuple[str, dict[str, Any], Reply] | None = None
        self.first_token_s = 0.0  # the longest wait for a first token seen: no call starts with less
        agent.provider.flight.on_tick = self._tick

    def begin_round(self, ctx: Context) -> None:
        self.deadline = ctx.deadline
        self.op, self.round, self.number = ctx.operator.name, self.agent.rounds.get(ctx.operator.name, 0), 0

    def call(self, op: str, turns: list[Turn], opening: Opening) -> Reply | None:
        """One answered call, with retries; None (and a fault or note said) when none can be had."""
        a = self.agent
        attempt = 0
        while True:
            if a.provider.flight.cancelled:
                a.halted = f"cancelled by {a.provider.flight.cancelled}"
                a.budget.note("notes", f"{op}: {a.halted}: no further model call")
                return None
            limit = self._limit(op)
            if limit is None:
                return None
            system, sent = prompt.system(a.plain), _sent(turns)
            text = system + json.dumps(sent) + ("" if a.plain else json.dumps(prompt.TOOLS))
            est = self.prompt_tokens = a.counter(text) + MESSAGE_TOKENS * (len(sent) + 1)
            max_out = self._output_room(op, est, opening)
            if max_out is None:
                return None
            self.number += 1
            request: dict[str, Any] = {
                "max_tokens": max_out,
                "tools": not a.plain,
                "seconds": round(limit[0], 1),
            }
            request |= {"prompt_tokens": est, "messages": [{"role": "system", "content": system}, *sent]}
            try:
                reply = a.provider.send(system, turns, max_out, not a.plain, *limit)
            except CallError as e:
                self._slow(a.provider.flight)
                self._keep(op, request, error=a.scrub(e.what), partial=e.partial)
                if not self._recover(op, e, turns, opening, attempt, len(text)):
                    return None
                attempt += 1
                continue
            if reply.estimated:
                reply.usage["input_tokens"] = est
            self._slow(a.provider.flight)
            if reply.stop == "repeating":
                said = f"{op}: the model said one thing over and over: its reply was cut after"
                a.budget.note("notes", f"{said} {a.provider.flight.tokens} tokens (the connection closed)")
            self._record(op, reply, len(text))
            self.pending = (op, request, reply)  # kept by `done`, with what became of the reply
            return reply

    def done(self, outcome: str) -> None:
        """The last answered call's record, with what became of its reply (the agent's answer)."""
        if self.pending is not None:
            op, request, reply = self.pending
            self.pending = None
            self._keep(op, request, reply=reply, outcome=outcome)

    # -- limits ------------------------------------------------------------------------------------
    def _limit(self, op: str) -> tuple[float, str] | None:
        """(seconds, how it ends) for the next call: the request time-out, or the time budget's
        end when that comes first; None (a fault said) when the budget leaves no time for a call."""
        a = self.agent
        left = float("inf") if self.deadline is None else self.deadline - time.monotonic()
        if left < max(a.limits.least_call_s, self.first_token_s):
            a.fault(op, "the time budget (--kope-time-budget) leaves no time for a model call; round ended")
            return None
        return (a.limits.timeout, "time-out") if a.limits.timeout <= left else (left, "budget")

    def _output_room(self, op: str, est: int, opening: Opening) -> int | None:
        """max_tokens for a call with a prompt of ~`est` tokens: what the context leaves, within the
        operator's token budget (usage.py); None (a fault said) when that would not hold a kernel."""
        a = self.agent
        least = min(a.limits.min_output_tokens, a.counter(opening.ctx.operator.source) + 128)
        room = a.window.output_room(est)
        if room < least:
            a.fault(
                op,
                f"the conversation (~{est} tokens) leaves {max(room, 0)} of the model's {a.window.said()}"
                f" for a reply, under the {least} a kernel needs; round ended",
            )
            return None
        return a.budget.room(op, est, room, least)

    # -- after an error ----------------------------------------------------------------------------
    def _recover(
        self, op: str, e: CallError, turns: list[Turn], opening: Opening, attempt: int, chars: int
    ) -> bool:
        """Whether the call is worth another try after `e` (after a back-off, a refit or a switch)."""
        a = self.agent
        what = a.scrub(e.what)
        tries = f"after {attempt + 1} tries" if attempt else "on the first try"
        if e.kind == "cancelled":
            a.halted = what
            a.budget.note("notes", f"{op}: {what}: no further model call")
            return False
        if e.kind == "stop":
            a.halted = what
            a.fault(op, f"{what}; the {a.name} agent stops")
            return False
        if e.kind == "no_tools" and a.to_plain(what):
            return self._reopen(turns, opening)
        if e.kind == "context" and opening.sent <= MAX_RESENDS:
            return self._refit(op, e, what, turns, opening, chars)
        if e.kind != "retry" or attempt >= a.limits.max_retries:
            a.fault(op, f"{what} {tries}; round ended")
            return False
        delay = self._delay(attempt, e.retry_after)
        left = float("inf") if self.deadline is None else self.deadline - time.monotonic()
        if delay + max(a.limits.least_call_s, self.first_token_s) > left:
            a.fault(op, f"{what} {tries}; the time budget leaves no time to retry; round ended")
            return False
        a.budget.data.setdefault("retries", []).append(f"{op}: {a.scrub(e.short)}, retried in {delay:.1f} s")
        a.provider.flight.sleep(delay)
        return True

    def _refit(
        self, op: str, e: CallError, what: str, turns: list[Turn], opening: Opening, chars: int
    ) -> bool:
        """A context-length error: the context size and the prompt's real tokens it states are
        learned, and the opening is fitted to them (without numbers: one size step smaller)."""
        a = self.agent
        learned = a.window.learn(e.context, "the server's context-length error")
        if e.prompt_tokens:
            before = a.counter.chars_per_token
            a.counter.learn(chars, e.prompt_tokens, "the server's context-length error")
            learned = learned or a.counter.chars_per_token < before
        if not learned:
            opening.level += 1
        a.budget.note("retries", f"{op}: {what}; the prompt refitted to the model's {a.window.said()}")
        return self._reopen(turns, opening)

    def _reopen(self, turns: list[Turn], opening: Opening) -> bool:
        made = opening.turn()
        if made is None:
            return False
        turns[0] = made
        return True

    def _slow(self, flight: InFlight) -> None:
        """How long this server takes to begin a reply (a prompt's reading, on a CPU: minutes)."""
        waited = flight.first if flight.first is not None else flight.elapsed() if flight.ended else 0.0
        self.first_token_s = max(self.first_token_s, waited)

    def _delay(self, attempt: int, asked: float | None) -> float:
        limits = self.agent.limits
        if asked is not None:
            return min(asked, max(limits.max_retry_delay, 60.0))
        return min(limits.retry_delay * 2.0**attempt, limits.max_retry_delay) * random.uniform(0.75, 1.0)

    # -- records -----------------------------------------------------------------------------------
    def _record(self, op: str, reply: Reply, chars: int) -> None:
        """An answered call's tokens: to the budget, the graph, and the token counter."""
        a = self.agent
        a.budget.add(op, reply.usage)
        for note in reply.notes:
            a.budget.note("notes", a.scrub(note))
        seen = sum(v for k, v in reply.usage.items() if k != "output_tokens")
        if seen and not reply.estimated:
            a.counter.learn(chars, seen, "the server's token counts")
        if a.graph_sink is not None:
            try:
                a.graph_sink(op, a.model, dict(reply.usage))
            except Exception as e:  # bookkeeping must not end the round
                a.fault(op, f"recording usage failed: {type(e).__name__}: {e}")

    def _keep(
        self,
        op: str,
        request: dict[str, Any],
        reply: Reply | None = None,
        error: str = "",
        outcome: str = "",
        partial: str = "",
    ) -> None:
        a = self.agent
        got = {"text": partial, "partial": True} if partial else None
        if reply is not None:
            got = {
                "text": reply.text,
                "calls": [{"id": c.id, "name": c.name, "input": c.input} for c in reply.calls],
                "stop": reply.stop,
                "usage": reply.usage,
                "usage_estimated": reply.estimated,
                "first_token_s": reply.first_token_s,
                "seconds": reply.seconds,
            }
        a.keep(
            {
                "kind": "call",
                "operator": op,
                "round": self.round,
                "call": self.number,
                "agent": a.name,
                "provider": a.provider.name,
                "model": a.model,
                "api": a.provider.api,
                "request": request,
                "reply": got,
                "error": error or None,
                "outcome": a.scrub(outcome) or None,  # what the agent made of the reply
                "seconds": round(reply.seconds if reply is not None else a.provider.flight.elapsed(), 3),
            }
        )

    def _tick(self, flight: InFlight) -> None:
        """A long call's progress, on the terminal."""
        a = self.agent
        if a.line_sink is None:
            return
        took = flight.elapsed()
        if not a.provider.streams:
            how = f"waiting for the reply: {took:.0f} s so far (of {flight.seconds:.0f} s allowed)"
        elif flight.first is None:
            how = f"no token yet after {took:.0f} s (the server is reading a prompt of ~{self.prompt_tokens} tokens)"
        else:
            how = f"{flight.tokens} tokens received in {took:.0f} s (the first after {flight.first:.0f} s)"
        a.line_sink(f"kope {self.op}: model call {self.number} of round {self.round}: {how}")


def _sent(turns: list[Turn]) -> list[dict[str, Any]]:
    """The conversation as a record holds it, in neither provider's terms."""
    out: list[dict[str, Any]] = []
    for t in turns:
        said: dict[str, Any] = {"role": t.role, "content": "\n\n".join(t.parts) if t.parts else t.text}
        if t.calls:
            said["tool_calls"] = [{"id": c.id, "name": c.name, "input": c.input} for c in t.calls]
        if t.results:
            said["tool_results"] = [{"id": r.call_id, "error": r.error, "text": r.text} for r in t.results]
        out.append(said)
    return out
