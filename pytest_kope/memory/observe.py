"""What judging saw, as observation rows; and token usage in the graph's column names."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any

from ..judge.outcome import Judged, Outcome

BUILD_LOG_HEAD, BUILD_LOG_TAIL = 4_000, 12_000  # a build log is kept as its head and tail


def _trim(log: str) -> str:
    if len(log) <= BUILD_LOG_HEAD + BUILD_LOG_TAIL:
        return log
    cut = len(log) - BUILD_LOG_HEAD - BUILD_LOG_TAIL
    return f"{log[:BUILD_LOG_HEAD]}\n[... {cut} characters cut ...]\n{log[-BUILD_LOG_TAIL:]}"


def token_counts(usage: Mapping[str, Any]) -> dict[str, int]:
    """An API usage record as token counts by kind."""

    def get(*names: str) -> int:
        return int(next((usage[n] for n in names if usage.get(n) is not None), 0))

    return {
        "input_tokens": get("input_tokens", "tokens_in"),
        "output_tokens": get("output_tokens", "tokens_out"),
        "cache_read": get("cache_read_input_tokens", "cache_read", "tokens_cache_read"),
        "cache_write": get("cache_creation_input_tokens", "cache_write", "tokens_cache_write"),
    }


def observations_of(judged: Judged) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, text, data) for everything judging saw: build log, each failure, crash, timings, notes."""
    outcome = Outcome(judged.outcome)
    if judged.build_log:
        yield "build_log", _trim(judged.build_log), {"chars": len(judged.build_log)}
    failure_kind = "screen" if outcome is Outcome.REJECTED else "test_failure"
    for failure in judged.failures:
        test, _, message = failure.partition(": ")
        yield failure_kind, failure, {"test": test if message else ""}
    if outcome in (Outcome.CRASHED, Outcome.TIMEOUT):
        cause = judged.failures[0] if judged.failures else "; ".join(judged.notes) or outcome.value
        yield "crash", f"{outcome.value}: {cause}", {"outcome": outcome.value}
    for t in judged.timings:
        text = (
            f"{t.test}: {t.ratio:.3f}x vs reference (low {t.ratio_low:.3f}, high {t.ratio_high:.3f}),"
            f" {t.candidate_s:.3g}s vs {t.reference_s:.3g}s over {t.rounds} rounds"
        )
        yield "timing", text, asdict(t)
    for note in judged.notes:
        yield "note", note, {}
