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
import json
import os
import random
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ..candidate import Candidate
from ..errors import ConfigError, SpecError
from ..judge import draft
from ..judge.outcome import Judged
from ..spec import FLAGS, parse_spec
from ..toolchains import screening
from . import claude_prompt as prompt
from .base import Context

DEFAULT_MODEL = "claude-sonnet-4-6"  # the SDK marks claude-sonnet-4-5 deprecated
TOKEN_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
NO_KEY = "--kope-agent claude needs ANTHROPIC_API_KEY (export it, or use --kope-agent tuner)"
COMPILER_CHARS = 2_000
_KEY_LIKE = re.compile(r"sk-ant-[A-Za-z0-9_\-]{6,}")
_KOPE_LINE = re.compile(r"^\s*(?://+|#+|/\*+|\*+)?\s*kope:")
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
        try:  # an ini value arrives as a string
            self.max_tokens_run = None if max_tokens_run in (None, "") else int(max_tokens_run)
        except (TypeError, ValueError):
            raise ConfigError(
                f"--kope-max-tokens needs a whole number of tokens, got {max_tokens_run!r}"
            ) from None
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
        self._round_tokens = 0
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
        self._round_tokens = self._round_input = 0
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
        est = max(self._round_input, _chars(messages) // prompt.CHARS_PER_TOKEN)
        max_out = self.max_output_tokens
        caps = []
        if self.max_tokens_run is not None:
            caps.append(("run token cap", self.max_tokens_run - self._total()))
        if ctx.tokens_left is not None:
            caps.append(("run's tokens left", ctx.tokens_left - self._round_tokens))
        for what, left in caps:
            if left - est < self.min_output_tokens:
                self._fault(
                    op, f"{what} reached: {self._total()} tokens used, ~{est} more needed; stopped proposing"
                )
                if what == "run token cap":
                    self._stopped = "token cap"
                return None
            max_out = min(max_out, left - est)
        for attempt in range(self.max_retries + 1):
            tries = f"after {attempt + 1} tries" if attempt else "on the first try"
            try:
                # The SDK warns (e.g. of a deprecated model); under the user's `filterwarnings = error`
                # that would raise. Keep each warning as a note for the report instead.
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
            text, error = self._submit(ctx, inp, accepted, n)
        elif name == "query_experience":
            question = inp.get("question")
            ok = isinstance(question, str) and question.strip()
            text, error = (
                (self._recall(ctx, question, self.query_tokens), False) if ok else (_needs("question"), True)
            )
        elif name == "compile_draft":
            source = inp.get("source")
            ok = isinstance(source, str) and source.strip()
            text, error = (self._compile(ctx, source), False) if ok else (_needs("source"), True)
        else:
            text, error = (
                f"unknown tool {name!r}: use submit_candidate, query_experience or compile_draft",
                True,
            )
        if error and cut:
            text += " (your reply was cut off at the output-token limit: send a shorter source)"
        result = {"type": "tool_result", "tool_use_id": use_id, "content": self._scrub(text)}
        return {**result, "is_error": True} if error else result

    def _submit(
        self, ctx: Context, inp: dict[str, Any], accepted: list[Candidate], n: int
    ) -> tuple[str, bool]:
        op = ctx.operator
        source, idea, space = inp.get("source"), inp.get("idea"), inp.get("tuning_space")
        if not isinstance(source, str) or not source.strip():
            return _needs("source") + " (the complete kernel source file)", True
        if not isinstance(idea, str) or not idea.strip():
            return _needs("idea") + " (one line: what changes and why it is faster)", True
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
        refused = _screen(body, op.filename)
        if refused:
            return f"the source is refused: {'; '.join(refused[:5])}", True
        cand = Candidate(
            source=self._scrub(source),
            filename=op.filename,
            toolchain=op.toolchain,
            params=dict(spec.space.defaults),
            idea=self._scrub(" ".join(idea.split()))[:300],
            agent=self.name,
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

    def _recall(self, ctx: Context, state: str, budget: int) -> str:
        try:
            found = ctx.recall(state=state, budget=budget)
            text = "" if found is None else str(found.render(budget))
        except Exception as e:  # the graph is advice: a failing recall costs the advice, not the round
            self._fault(ctx.operator.name, f"recall failed: {type(e).__name__}: {e}")
            return "(experience unavailable)"
        text = prompt.clip(text, budget * prompt.CHARS_PER_TOKEN)
        if not text.strip():
            return "(nothing relevant recorded yet)"
        # lessons and attempts recorded from earlier candidates quote their failures and build logs
        return prompt.untrusted(text, "experience graph: lessons and results of earlier candidates")

    def _compile(self, ctx: Context, source: str) -> str:
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
        # built in the judge's sandbox with the toolchain's own command line: see judge/draft.py
        checked = draft.check(source, filename, self.compile_timeout, self.cc)
        if checked.reason:
            return checked.reason
        output = prompt.clip(checked.output, COMPILER_CHARS)
        fenced = prompt.untrusted(output, "compiler output for your draft") if output else ""
        return ("ok\n" + fenced).strip() if checked.ok else fenced

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
        self._round_tokens += sum(used.values())
        self._round_input = max(self._round_input, sum(v for k, v in used.items() if k != "output_tokens"))
        if self.graph_sink is not None:
            try:
                self.graph_sink(op, self.model, dict(used))
            except Exception as e:  # bookkeeping must not end the round
                self._fault(op, f"recording usage failed: {type(e).__name__}: {e}")

    def _fault(self, op: str, text: str) -> None:
        self._usage["faults"].append(self._scrub(f"{op}: {text}")[:600])

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _KEY_LIKE.sub("***", text)


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


def _param(block: Any) -> dict[str, Any] | None:
    if block.type == "tool_use":
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return {"type": "text", "text": block.text} if block.text.strip() else None


def _chars(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages)) + len(prompt.SYSTEM) + len(json.dumps(prompt.TOOLS))


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


def _screen(body: str, filename: str) -> list[str]:
    """The judge's source screen, run early so the model hears why at once (one implementation)."""
    language = prompt.language(filename)
    if language in ("c", "cpp", "cuda"):
        return screening.screen_c_source(body)
    if language == "python":
        return screening.screen_python_source(body, Path(filename).name)
    return []


def _msg(e: Any) -> str:
    return prompt.clip(str(getattr(e, "message", "") or e), 200)


def _needs(field: str) -> str:
    return f"`{field}` must be a non-empty string"
