"""The `claude` agent: writes new kernels with the Anthropic Messages API and tool use.

Each proposal round is a fresh, bounded conversation: the cached static block (operator source, tests,
contract, hardware) plus this round's incumbent, verdicts, a one-line-each summary of earlier rounds and
the recalled experience within a fixed token budget. The model answers with tool calls
(`query_experience`, `compile_draft`, `submit_candidate`) until it has submitted `n` candidates or the
round's turn limit is reached.

Nothing the API does crashes the run: rate limits, overload and time-outs are retried with back-off,
and whatever still fails (or a garbled reply) ends the round with a fault note in `usage()["faults"]`.
The API key never leaves the HTTP header: it is scrubbed from every text this agent stores or returns.
The compile check runs in the judge's sandbox (judge/draft.py), and whatever text came from a candidate
(compiler output, build logs, test failures) reaches the model fenced as untrusted data.
"""

from __future__ import annotations

import copy
import os
import random
import re
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

from ...candidate import Candidate
from ...errors import ConfigError
from ...forge import redact
from ...judge.outcome import Judged
from ...memory.recall import CHARS_PER_TOKEN
from ..base import Context
from . import prompt
from .tools import _chars, _msg, _needs, _param, compile_check, submit

DEFAULT_MODEL = "claude-sonnet-4-6"  # a current model: the SDK warns of deprecated ones
TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
NO_KEY = "--kope-agent claude needs ANTHROPIC_API_KEY (export it, or use --kope-agent tuner)"
_KEY_LIKE = re.compile(r"sk-ant-[A-Za-z0-9_\-]{6,}")
Sink = Callable[[str, str, dict[str, int]], None]


class ClaudeAgent:
    """Proposes new kernel sources written by Claude; see the module docstring."""

    name = "claude"

    def __init__(
        self,
        model: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens_run: int | str | None = None,
        graph_sink: Sink | None = None,
        timeout: float = 120,
        max_retries: int = 4,
        *,
        retry_delay: float = 1.0,
        max_retry_delay: float = 30.0,
        max_turns: int = 6,
        max_output_tokens: int = 8_192,
        min_output_tokens: int = 1_024,
        recall_tokens: int = 1_500,
        query_tokens: int = 1_000,
        compile_timeout: float = 20.0,
        cc: str | None = None,
    ):
        key = api_key or os.environ.get("ANTHROPIC_API_KEY") or ""
        if not key.strip():
            raise ConfigError(NO_KEY)
        try:
            import anthropic
        except ImportError as e:  # a core dependency, but an environment can still lack it
            raise ConfigError(
                f"the claude agent needs the anthropic SDK: pip install pytest-kope ({e})"
            ) from None
        self._anthropic = anthropic
        self._secrets = [key]
        self.model = model or os.environ.get("KOPE_MODEL") or DEFAULT_MODEL
        self.max_tokens_run = _token_cap(max_tokens_run)
        self.graph_sink = graph_sink
        self.max_retries, self.retry_delay, self.max_retry_delay = max_retries, retry_delay, max_retry_delay
        self.max_turns, self.max_output_tokens, self.min_output_tokens = (
            max_turns,
            max_output_tokens,
            min_output_tokens,
        )
        self.recall_tokens, self.query_tokens = recall_tokens, query_tokens
        self.compile_timeout, self.cc = compile_timeout, cc
        # One retry layer, ours: the SDK's would sleep 0.5 s on `retry-after: 0` and hide the attempts.
        kwargs: dict[str, Any] = {"api_key": key, "timeout": timeout, "max_retries": 0}
        if base_url:
            kwargs["base_url"] = base_url
        self._client = anthropic.Anthropic(**kwargs)
        self._usage: dict[str, Any] = {
            "calls": 0,
            **dict.fromkeys(TOKEN_KEYS, 0),
            "faults": [],
            "notes": [],
            "per_operator": {},
        }
        self._last: dict[str, list[Judged]] = {}  # operator -> verdicts on its last round
        self._earlier: dict[str, list[str]] = {}  # operator -> one line per earlier verdict
        self._stopped: str | None = None  # why this agent proposes nothing more (cap, auth, model)
        self._round_input = 0

    # -- the Agent protocol ------------------------------------------------------------------------

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        if n <= 0 or self._stopped:
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
        out = copy.deepcopy(self._usage)
        out["model"] = self.model
        return out

    def close(self) -> None:
        self._client.close()

    # -- one round ---------------------------------------------------------------------------------

    def _round(self, ctx: Context, n: int) -> list[Candidate]:
        op = ctx.operator
        last = self._last.get(op.name, [])
        experience = self._recall(ctx, prompt.recall_state(ctx, last), self.recall_tokens)
        dynamic = prompt.dynamic_block(ctx, n, last, self._earlier.get(op.name, []), experience)
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [prompt.static_block(op, ctx.hardware), dynamic]}
        ]
        accepted: list[Candidate] = []
        nudged = False
        self._round_input = 0
        for _ in range(self.max_turns):
            response = self._call(ctx, messages)
            if response is None:
                break
            blocks = [b for b in (response.content or []) if b.type in ("text", "tool_use")]
            uses = [b for b in blocks if b.type == "tool_use"]
            if not uses:
                if response.stop_reason == "refusal":
                    self._fault(op.name, "the model refused; round ended")
                    break
                what = "an empty reply" if not blocks else "a reply without a tool call"
                if nudged:
                    self._fault(op.name, f"{what} after a reminder to call submit_candidate; round ended")
                    break
                nudged = True
                said = [{"type": "text", "text": b.text} for b in blocks if b.text.strip()]
                if said:
                    messages += [
                        {"role": "assistant", "content": said},
                        {"role": "user", "content": [{"type": "text", "text": prompt.NUDGE}]},
                    ]
                else:  # an empty assistant turn cannot go back to the API: remind in the same user turn
                    self._fault(op.name, "the model sent an empty reply; reminded it once")
                    messages[-1]["content"] = [
                        *messages[-1]["content"],
                        {"type": "text", "text": prompt.NUDGE},
                    ]
                continue
            messages.append({"role": "assistant", "content": [_param(b) for b in blocks if _param(b)]})
            cut = response.stop_reason == "max_tokens"
            results = [self._tool(ctx, use.id, use.name, use.input, accepted, n, cut) for use in uses]
            if len(accepted) >= n:
                break
            messages.append({"role": "user", "content": results})
        else:
            if not accepted:
                self._fault(op.name, f"no candidate accepted within {self.max_turns} turns; round ended")
        per = self._per(op.name)
        per["candidates"] += len(accepted)
        return accepted

    def _call(self, ctx: Context, messages: list[dict[str, Any]]) -> Any:
        """One Messages-API call with retries; None (and a fault noted) when it cannot be had."""
        anthropic, op = self._anthropic, ctx.operator.name
        max_out = self._output_room(op, messages)
        if max_out is None:
            return None
        for attempt in range(self.max_retries + 1):
            tries = f"after {attempt + 1} tries" if attempt else "on the first try"
            try:
                response = self._create(messages, max_out)
            except anthropic.APIStatusError as e:
                code, headers = e.status_code, e.response.headers
                if code in (401, 403, 404):
                    self._stopped = f"HTTP {code}"
                    self._fault(op, f"HTTP {code} from the Messages API ({_msg(e)}); the claude agent stops")
                    return None
                retry = headers.get("x-should-retry", "") == "true" or (
                    headers.get("x-should-retry", "") != "false" and (code in (408, 409, 429) or code >= 500)
                )
                if not retry or attempt == self.max_retries:
                    self._fault(op, f"HTTP {code} from the Messages API {tries}: {_msg(e)}; round ended")
                    return None
                delay = self._delay(attempt, headers)
                self._usage.setdefault("retries", []).append(f"{op}: HTTP {code}, retried in {delay:.1f} s")
            except anthropic.APIConnectionError as e:  # includes APITimeoutError
                kind = "time-out" if isinstance(e, anthropic.APITimeoutError) else "connection error"
                if attempt == self.max_retries:
                    self._fault(op, f"{kind} talking to the Messages API {tries}; round ended")
                    return None
                delay = self._delay(attempt, None)
                self._usage.setdefault("retries", []).append(f"{op}: {kind}, retried in {delay:.1f} s")
            except (ValueError, anthropic.AnthropicError) as e:  # garbled body: not transient, not retried
                self._fault(
                    op, f"malformed reply from the Messages API ({type(e).__name__}: {e}); round ended"
                )
                return None
            else:
                self._record(op, response)
                return response
            time.sleep(delay)
        return None

    def _output_room(self, op: str, messages: list[dict[str, Any]]) -> int | None:
        """The output tokens this call may ask for under the run's token cap; None (the agent stops,
        a fault noted) when what is left would not cover the prompt and a useful reply."""
        est = max(self._round_input, _chars(messages) // CHARS_PER_TOKEN)
        if self.max_tokens_run is None:
            return self.max_output_tokens
        left = self.max_tokens_run - self._total()
        if left - est < self.min_output_tokens:
            self._fault(
                op,
                f"run token cap reached: {self._total()} tokens used, ~{est} more needed; stopped proposing",
            )
            self._stopped = "token cap"
            return None
        return min(self.max_output_tokens, left - est)

    def _create(self, messages: list[dict[str, Any]], max_out: int) -> Any:
        """One Messages-API request. The SDK warns (e.g. of a deprecated model); under the user's
        `filterwarnings = error` that would raise, so each warning is kept as a note for the report."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            response = self._client.messages.create(
                model=self.model,
                max_tokens=max_out,
                system=cast(Any, prompt.system_blocks()),
                tools=cast(Any, prompt.TOOLS),
                messages=cast(Any, messages),
            )
        for w in caught:
            note = self._scrub(f"{w.category.__name__}: {w.message}")[:600]
            if note not in self._usage["notes"]:
                self._usage["notes"].append(note)
        return response

    def _delay(self, attempt: int, headers: Any) -> float:
        if headers is not None:
            for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
                try:
                    return min(max(float(headers.get(name)) * scale, 0.0), max(self.max_retry_delay, 60.0))
                except (TypeError, ValueError):
                    pass
        return min(self.retry_delay * 2.0**attempt, self.max_retry_delay) * random.uniform(0.75, 1.0)

    # -- tools -------------------------------------------------------------------------------------

    def _tool(
        self, ctx: Context, use_id: str, name: str, inp: Any, accepted: list[Candidate], n: int, cut: bool
    ) -> dict[str, Any]:
        inp = inp if isinstance(inp, dict) else {}
        if name == "submit_candidate":
            text, error = submit(ctx, inp, accepted, n, self._scrub, self.name)
        elif name == "query_experience":
            question = inp.get("question")
            ok = isinstance(question, str) and question.strip()
            text, error = (
                (self._recall(ctx, question, self.query_tokens), False) if ok else (_needs("question"), True)
            )
        elif name == "compile_draft":
            source = inp.get("source")
            ok = isinstance(source, str) and source.strip()
            text, error = (
                (compile_check(ctx, source, self.compile_timeout, self.cc), False)
                if ok
                else (_needs("source"), True)
            )
        else:
            text, error = (
                f"unknown tool {name!r}: use submit_candidate, query_experience or compile_draft",
                True,
            )
        if error and cut:
            text += " (your reply was cut off at the output-token limit: send a shorter source)"
        result = {"type": "tool_result", "tool_use_id": use_id, "content": self._scrub(text)}
        return {**result, "is_error": True} if error else result

    def _recall(self, ctx: Context, state: str, budget: int) -> str:
        try:
            found = ctx.recall(state=state, budget=budget)
            text = "" if found is None else str(found.render(budget))
        except Exception as e:  # the graph is advice: a failing recall costs the advice, not the round
            self._fault(ctx.operator.name, f"recall failed: {type(e).__name__}: {e}")
            return "(experience unavailable)"
        text = prompt.clip(text, budget * CHARS_PER_TOKEN)
        if not text.strip():
            return "(nothing relevant recorded yet)"
        # lessons and attempts recorded from earlier candidates quote their failures and build logs
        return prompt.untrusted(text, "experience graph: lessons and results of earlier candidates")

    # -- bookkeeping -------------------------------------------------------------------------------

    def _per(self, op: str) -> dict[str, Any]:
        per: dict[str, Any] = self._usage["per_operator"].setdefault(
            op, {"calls": 0, **dict.fromkeys(TOKEN_KEYS, 0), "candidates": 0}
        )
        return per

    def _total(self) -> int:
        return sum(self._usage[k] for k in TOKEN_KEYS)

    def _record(self, op: str, response: Any) -> None:
        u = response.usage
        used = {k: int(getattr(u, k, 0) or 0) for k in TOKEN_KEYS}
        per = self._per(op)
        for target in (self._usage, per):
            target["calls"] += 1
            for k, v in used.items():
                target[k] += v
        self._round_input = max(self._round_input, sum(v for k, v in used.items() if k != "output_tokens"))
        if self.graph_sink is not None:
            try:
                self.graph_sink(op, self.model, dict(used))
            except Exception as e:  # bookkeeping must not end the round
                self._fault(op, f"recording usage failed: {type(e).__name__}: {e}")

    def _fault(self, op: str, text: str) -> None:
        self._usage["faults"].append(self._scrub(f"{op}: {text}")[:600])

    def _scrub(self, text: str) -> str:
        return _KEY_LIKE.sub("***", redact(text, *self._secrets))


def _token_cap(given: int | str | None) -> int | None:
    """--kope-max-tokens (an ini value arrives as a string); None: no cap."""
    try:
        return None if given is None or given == "" else int(given)
    except (TypeError, ValueError):
        raise ConfigError(f"--kope-max-tokens needs a whole number of tokens, got {given!r}") from None
