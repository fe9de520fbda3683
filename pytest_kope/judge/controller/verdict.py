"""A child's verdict, decided from its signed, typed events alone (never from message text)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from ...candidate import Candidate
from ..outcome import Judged, Outcome, Timing
from ..protocol import read_events
from . import sandbox
from .judgement import Request


def read(
    request: Request, finished: sandbox.Finished, work: Path, key: bytes, clock: tuple[float, float]
) -> Judged:
    """The verdict on one child, from what it left in `work`: its events signed with `key` (a line
    that is not is forged, and a correct verdict with one is incorrect), its end, its replayed outputs
    (`request.differential`); `clock` is when it began and ended on the clock its events use (its
    node's)."""
    events, forged = read_events(work / "results.jsonl", key)
    judged = interpret(request.candidate, finished, events, request.tests)
    judged.phases = phases(events, clock[0], clock[1], timing=request.reference is not None)
    asserted = [e["asserted"] for e in events if e["event"] == "recorded" and e.get("asserted")]
    judged.asserted = (float(asserted[-1][0]), float(asserted[-1][1])) if asserted else None
    judged.shrunk = next((str(e["smallest"]) for e in events if e["event"] == "shrunk" and e["smallest"]), "")
    if request.differential is not None and judged.outcome in (Outcome.OK, Outcome.INCORRECT):
        compared = time.monotonic()
        judged.differential = request.differential.check(events, work / "replayed")
        judged.replay_died = next((str(e.get("kind") or "") for e in events if e["event"] == "replayed"), "")
        judged.phases["compare"] = time.monotonic() - compared
    if forged:
        judged.notes.append(f"dropped {forged} unsigned line(s) in the child's results (forged)")
        if judged.outcome.correct:
            judged.outcome = Outcome.INCORRECT
            judged.failures.insert(0, f"forged {forged} result line(s) the judge did not sign")
    return judged


def interpret(
    candidate: Candidate, finished: sandbox.Finished, events: list[dict[str, Any]], tests: list[str]
) -> Judged:
    """Turn what a child did into a verdict, from its typed events alone.

    Every selected test must have been collected, and every item the child collected for it (one per
    seed for a test that takes fresh inputs, one for a test that makes its own) must have passed.
    The stages below run in order; the first that finds a fault decides the outcome.
    """
    run = _Run(finished, events, tests)
    judged = Judged(
        candidate, Outcome.OK, tests_passed=sorted({e["test"] for e in run.calls}), seconds=finished.wall_s
    )
    for stage in (_killed, _build_failed, _tests_failed, _unfinished, _incomplete):
        if stage(judged, run):
            return judged
    _timed(judged, run)
    return judged


class _Run:
    """A child's events, sorted once for the stages."""

    def __init__(self, finished: sandbox.Finished, events: list[dict[str, Any]], tests: list[str]):
        self.finished, self.events, self.tests = finished, events, tests
        started = [e["test"] for e in events if e["event"] == "start"]
        self.last = started[-1] if started else "collection"
        reports = [e for e in events if e["event"] == "report"]
        self.failed = [e for e in reports if e["outcome"] == "failed"]
        self.calls = [e for e in reports if e["outcome"] == "passed" and e["when"] == "call"]
        self.passed = {e.get("id", e["test"]) for e in self.calls}
        self.skipped = {e.get("id", e["test"]): e for e in reports if e["outcome"] == "skipped"}

    def tail(self) -> str:
        return _tail(self.finished.output)


def _killed(judged: Judged, run: _Run) -> bool:
    """Out of wall time, killed by a signal, or an exit status no pytest run gives."""
    finished = run.finished
    if finished.timed_out:
        judged.outcome = Outcome.TIMEOUT
        judged.failures = [f"{run.last}: no result after {finished.wall_s:.0f} s (wall-clock limit); killed"]
        return True
    sig = finished.signal
    if sig is not None or (finished.returncode not in (0, 1) and not run.failed):
        name = signal.Signals(sig).name if sig else f"exit status {finished.returncode}"
        judged.outcome = Outcome.TIMEOUT if sig == signal.SIGXCPU else Outcome.CRASHED
        judged.failures = [f"{run.last}: process killed by {name}" + run.tail()]
        return True
    return False


def _build_failed(judged: Judged, run: _Run) -> bool:
    h = judged.candidate.hash
    builds = [e for e in run.events if e["event"] == "build_failed" and e["candidate"] == h]
    if not builds:
        return False
    judged.outcome = Outcome.REJECTED if builds[0]["kind"] == "rejected" else Outcome.COMPILE_FAILED
    judged.build_log = builds[0]["message"]
    judged.failures = [builds[0]["message"]]
    return True


def _tests_failed(judged: Judged, run: _Run) -> bool:
    for e in run.failed:
        judged.failed_runs.append((e["test"], e.get("seed") if e["when"] == "call" else None))
        judged.failures.append(f"{e['test']}: {e['message'].strip()}")
        if judged.outcome == Outcome.OK:
            judged.outcome = _FAILURE_KINDS.get(e["kind"], Outcome.RUNTIME_FAILED)
    if judged.outcome == Outcome.OK:
        return False
    judged.failures = _dedupe(judged.failures)
    return True


def _unfinished(judged: Judged, run: _Run) -> bool:
    """The child never said it was done, or every test skipped."""
    if not any(e["event"] == "done" for e in run.events):
        judged.outcome = Outcome.CRASHED
        judged.failures = [f"{run.last}: the test process ended without finishing" + run.tail()]
        return True
    if run.skipped and not run.passed:
        first = next(iter(run.skipped.values()))
        judged.outcome = Outcome.RUNTIME_FAILED
        judged.failures = [f"all tests skipped: {first['message'] or 'see log'}"]
        return True
    return False


def _incomplete(judged: Judged, run: _Run) -> bool:
    """A selected test not collected, or a collected item (per seed) without a passing result."""
    collected = [i for e in run.events if e["event"] == "collected" for i in e["items"]]
    judged.fixed_inputs = sorted({i["test"] for i in collected if not i["fresh"]})
    missing = sorted(set(run.tests) - {i["test"] for i in collected})
    unpassed = [i["id"] for i in collected if i["id"] not in run.passed and i["id"] not in run.skipped]
    if not (missing or unpassed):
        return False
    judged.outcome = Outcome.RUNTIME_FAILED
    what = f"not collected: {missing[0]}" if missing else f"no passing result for {unpassed[0]}"
    judged.failures = [f"{what} ({len(missing) + len(unpassed)} in all)" + run.tail()]
    return True


def _timed(judged: Judged, run: _Run) -> None:
    """The timings, and what the timed calls' output checks found."""
    for e in run.events:
        if e["event"] != "timing":
            continue
        judged.timings.append(Timing(**{k: e[k] for k in Timing.__dataclass_fields__ if k in e}))
        if e.get("mismatch"):
            judged.outcome = Outcome.INCORRECT
            judged.failures.append(
                f"{e['test']}: the candidate's timed outputs differ from the reference kernel's: {e['mismatch']}"
            )
        elif e.get("suspect") and judged.outcome == Outcome.OK:
            judged.outcome = Outcome.SUSPECT
            judged.notes.append(f"suspect: {e['test']}: {e['suspect']}")


# What a failed test's exception says about the candidate (anything else: RUNTIME_FAILED).
_FAILURE_KINDS = {
    "AssertionError": Outcome.INCORRECT,
    "GuardViolation": Outcome.INCORRECT,
    "Failed": Outcome.INCORRECT,
    "MemoryError": Outcome.CRASHED,
    "KernelDied": Outcome.CRASHED,  # its kernel server died in a call: a crash, a forbidden system call
    "KernelTimeout": Outcome.TIMEOUT,
    "LoweringFailed": Outcome.COMPILE_FAILED,  # the test host's Ascend lowering check of a launch
}


def replay_outcome(died: str) -> Outcome:
    """A differential finding's outcome: a crash or a time-out where the candidate's kernel server
    died or hung in a replayed call (`died`, the typed kind its child sent), else incorrect."""
    return {"KernelDied": Outcome.CRASHED, "KernelTimeout": Outcome.TIMEOUT}.get(died, Outcome.INCORRECT)


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
    or loading kernels), `kernel` (timed kernel calls), `tests` (the correctness tests' own code:
    making inputs, references, asserts), and the rest as `timing` or `correctness`."""
    rest = "timing" if timing else "correctness"
    collected = next((e["t"] for e in events if e["event"] == "collected" and "t" in e), None)
    done = next((e for e in events if e["event"] == "done" and "t" in e), None)
    if collected is None or done is None:
        return {"start": 0.0, "build": 0.0, "kernel": 0.0, "tests": 0.0, rest: ended - began}
    build, kernel = float(done.get("build_s", 0.0)), float(done.get("kernel_s", 0.0))
    tests = float(done.get("tests_s", 0.0))
    return {
        "start": max(0.0, collected - began) + max(0.0, ended - done["t"]),
        "build": build,
        "kernel": kernel,
        "tests": tests,
        rest: max(0.0, done["t"] - collected - build - kernel - tests),
    }
