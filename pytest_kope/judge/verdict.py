"""A child's verdict, decided from its signed, typed events alone (never from message text)."""

from __future__ import annotations

import signal
from typing import Any

from ..candidate import Candidate
from . import sandbox
from .outcome import Judged, Outcome, Timing


def interpret(
    candidate: Candidate, finished: sandbox.Finished, events: list[dict[str, Any]], tests: list[str]
) -> Judged:
    """Turn what a child did into a verdict, from its typed events alone.

    Every selected test must have been collected, and every item the child collected for it (one per
    seed for a test that takes fresh inputs, one for a test that makes its own) must have passed.
    """
    started = [e["test"] for e in events if e["event"] == "start"]
    reports = [e for e in events if e["event"] == "report"]
    failed = [e for e in reports if e["outcome"] == "failed"]
    calls = [e for e in reports if e["outcome"] == "passed" and e["when"] == "call"]
    passed = {e.get("id", e["test"]) for e in calls}
    skipped = {e.get("id", e["test"]): e for e in reports if e["outcome"] == "skipped"}
    judged = Judged(
        candidate, Outcome.OK, tests_passed=sorted({e["test"] for e in calls}), seconds=finished.wall_s
    )
    last = started[-1] if started else "collection"
    if finished.timed_out:
        judged.outcome = Outcome.TIMEOUT
        judged.failures = [f"{last}: no result after {finished.wall_s:.0f} s (wall-clock limit); killed"]
        return judged
    sig = finished.signal
    if sig is not None or (finished.returncode not in (0, 1) and not failed):
        name = signal.Signals(sig).name if sig else f"exit status {finished.returncode}"
        judged.outcome = Outcome.TIMEOUT if sig == signal.SIGXCPU else Outcome.CRASHED
        judged.failures = [f"{last}: process killed by {name}" + _tail(finished.output)]
        return judged
    builds = [e for e in events if e["event"] == "build_failed" and e["candidate"] == candidate.hash]
    if builds:
        judged.outcome = Outcome.REJECTED if builds[0]["kind"] == "rejected" else Outcome.COMPILE_FAILED
        judged.build_log = builds[0]["message"]
        judged.failures = [builds[0]["message"]]
        return judged
    for e in failed:
        judged.failed_runs.append((e["test"], e.get("seed") if e["when"] == "call" else None))
        judged.failures.append(f"{e['test']}: {e['message'].strip()}")
        if judged.outcome == Outcome.OK:
            judged.outcome = _FAILURE_KINDS.get(e["kind"], Outcome.RUNTIME_FAILED)
    if judged.outcome != Outcome.OK:
        judged.failures = _dedupe(judged.failures)
        return judged
    if not any(e["event"] == "done" for e in events):
        judged.outcome = Outcome.CRASHED
        judged.failures = [f"{last}: the test process ended without finishing" + _tail(finished.output)]
        return judged
    if skipped and not passed:
        first = next(iter(skipped.values()))
        judged.outcome = Outcome.RUNTIME_FAILED
        judged.failures = [f"all tests skipped: {first['message'] or 'see log'}"]
        return judged
    collected = [i for e in events if e["event"] == "collected" for i in e["items"]]
    judged.fixed_inputs = sorted({i["test"] for i in collected if not i["fresh"]})
    missing = sorted(set(tests) - {i["test"] for i in collected})
    unpassed = [i["id"] for i in collected if i["id"] not in passed and i["id"] not in skipped]
    if missing or unpassed:
        judged.outcome = Outcome.RUNTIME_FAILED
        what = f"not collected: {missing[0]}" if missing else f"no passing result for {unpassed[0]}"
        judged.failures = [f"{what} ({len(missing) + len(unpassed)} in all)" + _tail(finished.output)]
        return judged
    for e in events:
        if e["event"] != "timing":
            continue
        judged.timings.append(Timing(**{k: e[k] for k in Timing.__dataclass_fields__}))
        if e.get("mismatch"):
            judged.outcome = Outcome.INCORRECT
            judged.failures.append(
                f"{e['test']}: the candidate's timed outputs differ from the reference kernel's: {e['mismatch']}"
            )
        elif e.get("suspect") and judged.outcome == Outcome.OK:
            judged.outcome = Outcome.SUSPECT
            judged.notes.append(f"suspect: {e['test']}: {e['suspect']}")
    return judged


# What a failed test's exception says about the candidate (anything else: RUNTIME_FAILED).
_FAILURE_KINDS = {
    "AssertionError": Outcome.INCORRECT,
    "GuardViolation": Outcome.INCORRECT,
    "Failed": Outcome.INCORRECT,
    "MemoryError": Outcome.CRASHED,
}


def _tail(output: str, n: int = 600) -> str:
    text = output.strip()
    return f"\n{text[-n:]}" if text else ""


def _dedupe(failures: list[str]) -> list[str]:
    seen, out = set(), []
    for f in failures:
        key = f.split(": ", 1)[-1][:200]
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def phases(events: list[dict[str, Any]], began: float, ended: float, timing: bool) -> dict[str, float]:
    """Where one child's wall time went, from its events' clock readings (CLOCK_MONOTONIC is shared
    by every process): `start` (spawn or fork to collected, plus done to reaped), `build` (building
    or loading kernels), `kernel` (timed kernel calls), and the rest as `timing` or `correctness`."""
    rest = "timing" if timing else "correctness"
    collected = next((e["t"] for e in events if e["event"] == "collected" and "t" in e), None)
    done = next((e for e in events if e["event"] == "done" and "t" in e), None)
    if collected is None or done is None:
        return {"start": 0.0, "build": 0.0, "kernel": 0.0, rest: ended - began}
    build, kernel = float(done.get("build_s", 0.0)), float(done.get("kernel_s", 0.0))
    return {
        "start": max(0.0, collected - began) + max(0.0, ended - done["t"]),
        "build": build,
        "kernel": kernel,
        rest: max(0.0, done["t"] - collected - build - kernel),
    }
