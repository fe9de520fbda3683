"""Judge candidates of one operator: correctness in parallel, performance one at a time, verification.

Every judgement is a fresh `pytest` child in the sandbox, running the operator's own tests with the
candidate as the `kernel` fixture's parameter; it reports back as JSON lines, and only this process
(the controller) interprets them and writes the graph.
"""

from __future__ import annotations

import json
import os
import queue
import random
import secrets
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..operator import Operator
from ..toolchains.devices import visible_devices_env
from . import sandbox
from .child import verify
from .outcome import Judged, Outcome, Timing


@dataclass
class Plan:
    """What the controller knows of one operator's oracle."""

    operator: Operator
    rootdir: Path
    inifile: Path | None
    files: list[Path]
    correctness: list[str]  # base node ids
    performance: list[str]
    toolchain_env: dict[str, str] = field(default_factory=dict)
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    seeds: int = 2
    jobs: int = max(1, os.cpu_count() or 1)
    keep: Path | None = None  # where to keep each child's log and source (the run dir)
    devices: tuple[int, ...] = ()  # accelerator indices: one timing worker each; correctness spreads over all
    plugins: tuple[str, ...] = ()  # extra pytest plugins the operator's tests need (ini `kope_plugins`)


class Judge:
    def __init__(self, plan: Plan, screen):
        self.plan = plan
        self.screen = screen  # toolchain.screen
        self.free_devices: queue.Queue[int | None] = queue.Queue()
        for device in plan.devices or (None,):
            self.free_devices.put(device)

    def correctness(self, candidates: list[Candidate]) -> list[Judged]:
        devices = self.plan.devices or (None,)
        jobs = [(c, devices[i % len(devices)]) for i, c in enumerate(candidates)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.plan.jobs, len(candidates)))) as pool:
            return list(pool.map(lambda job: self._correctness_one(*job), jobs))

    def _correctness_one(self, candidate: Candidate, device: int | None = None) -> Judged:
        reasons = self.screen(candidate)
        if reasons:
            return Judged(candidate, Outcome.REJECTED, failures=[f"screening: {r}" for r in reasons])
        seeds = [random.SystemRandom().randrange(1 << 31) for _ in range(max(1, self.plan.seeds))]
        return self._child(candidate, self.plan.correctness, seeds=seeds, reference=None, device=device)

    def performance_many(self, judged: list[Judged], reference: Candidate) -> list[Judged]:
        """Time several candidates against one reference, one worker per device (serially on a CPU)."""
        workers = max(1, len(self.plan.devices))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda j: self.performance(j, reference), judged))

    def performance(self, judged: Judged, reference: Candidate) -> Judged:
        """Time a correct candidate paired with `reference`, alone on a device; fills timings, decides nothing."""
        device = self.free_devices.get()
        try:
            timed = self._child(judged.candidate, self.plan.performance, [], reference, device=device)
        finally:
            self.free_devices.put(device)
        judged.seconds += timed.seconds
        if not timed.outcome.correct:
            judged.outcome, judged.failures = timed.outcome, timed.failures
            return judged
        judged.timings = timed.timings
        judged.notes += timed.notes
        if any(n.startswith("suspect:") for n in timed.notes):
            judged.outcome = Outcome.SUSPECT
        return judged

    def _child(
        self,
        candidate: Candidate,
        tests: list[str],
        seeds: list[int],
        reference: Candidate | None,
        device: int | None = None,
    ) -> Judged:
        plan = self.plan
        work = Path(tempfile.mkdtemp(prefix=f"kope-{plan.operator.name}-{candidate.short}-"))
        try:
            results = work / "results.jsonl"
            key = secrets.token_bytes(32)
            key_r, key_w = os.pipe()
            os.write(key_w, key)
            os.close(key_w)
            spec = {
                "key_fd": key_r,
                "candidate": candidate.to_json(),
                "reference": reference.to_json() if reference else None,
                "tests": tests,
                "seeds": seeds,
                "results": str(results),
                "operator": {
                    "name": plan.operator.name,
                    "source": str(plan.operator.source),
                    "toolchain": plan.operator.toolchain,
                    "family": plan.operator.family,
                },
            }
            (work / "spec.json").write_text(json.dumps(spec))
            # Only pytest-kope, the repo's conftests and the plugins named in `kope_plugins` load in a
            # judging child: entry-point plugins cost seconds per child (hypothesis alone ~1 s).
            plugins = [a for name in ("pytest_kope.plugin", *plan.plugins) for a in ("-p", name)]
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                *plugins,
                "-p",
                "pytest_kope.judge.child",
                "--kope-child",
                str(work / "spec.json"),
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "-q",
                "--rootdir",
                str(plan.rootdir),
                "--kope-seed",
                str(seeds[0] if seeds else 1),
            ]
            if plan.inifile:
                cmd += ["-c", str(plan.inifile)]
            cmd += [str(f) for f in plan.files]
            env = sandbox.scrubbed_environment(
                {
                    **plan.toolchain_env,
                    "KOPE_BUILD_DIR": str(work / "builds"),
                    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                    **(visible_devices_env(plan.operator.toolchain, device) if device is not None else {}),
                },
                work,
            )
            try:
                finished = sandbox.run(cmd, work, env, plan.limits, pass_fds=(key_r,))
            finally:
                os.close(key_r)
            events, forged = _events(results, key)
            judged = interpret(candidate, finished, events, tests, len(seeds) or 1)
            if forged:
                judged.notes.append(f"dropped {forged} unsigned line(s) in the child's results (forged)")
                if judged.outcome.correct:
                    judged.outcome = Outcome.INCORRECT
                    judged.failures.insert(0, f"forged {forged} result line(s) the judge did not sign")
            if plan.keep is not None:
                keep = plan.keep / candidate.short
                keep.mkdir(parents=True, exist_ok=True)
                (keep / Path(candidate.filename).name).write_text(candidate.source)
                shutil.copy(work / "child.log", keep / ("perf.log" if reference else "correctness.log"))
            return judged
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _events(path: Path, key: bytes) -> tuple[list[dict[str, Any]], int]:
    """The child's signed events, and how many lines were not signed with `key` (forged by a kernel)."""
    if not path.exists():
        return [], 0
    out, forged = [], 0
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        payload = verify(key, line)
        if payload is None:
            forged += i < len(lines) - 1 or line.endswith("}")  # not a last line cut short by a crash
            continue
        try:
            out.append(json.loads(payload))
        except json.JSONDecodeError:
            forged += 1
    return out, forged


def interpret(
    candidate: Candidate,
    finished: sandbox.Finished,
    events: list[dict[str, Any]],
    tests: list[str],
    seeds: int,
) -> Judged:
    """Turn what a child did into a verdict."""
    started = [e["test"] for e in events if e["event"] == "start"]
    reports = [e for e in events if e["event"] == "report"]
    failed = [e for e in reports if e["outcome"] == "failed"]
    passed = [e["test"] for e in reports if e["outcome"] == "passed" and e["when"] == "call"]
    skipped = [e for e in reports if e["outcome"] == "skipped"]
    judged = Judged(candidate, Outcome.OK, tests_passed=sorted(set(passed)), seconds=finished.wall_s)
    last = started[-1] if started else "collection"
    if finished.timed_out:
        judged.outcome = Outcome.TIMEOUT
        judged.failures = [f"{last}: no result after {finished.wall_s:.0f} s (wall-clock limit); killed"]
        return judged
    sig = finished.signal
    if sig is not None or (finished.returncode not in (0, 1) and not failed):
        name = signal.Signals(sig).name if sig else f"exit status {finished.returncode}"
        kind = Outcome.TIMEOUT if sig == signal.SIGXCPU else Outcome.CRASHED
        judged.outcome = kind
        judged.failures = [f"{last}: process killed by {name}" + _tail(finished.output)]
        return judged
    for e in failed:
        message = f"{e['test']}: {e['message'].strip()}"
        judged.failures.append(message)
        if "screening: " in e["message"]:  # the built library failed the toolchain's binary screen
            judged.outcome = Outcome.REJECTED
            judged.build_log = e["message"]
        elif e["kind"] == "BuildError" or "build of" in e["message"] and "failed" in e["message"]:
            judged.outcome = Outcome.COMPILE_FAILED
            judged.build_log = e["message"]
        elif e["kind"] == "MemoryError" and judged.outcome == Outcome.OK:
            judged.outcome = Outcome.CRASHED
        elif e["kind"] in ("AssertionError", "GuardViolation", "Failed") and judged.outcome == Outcome.OK:
            judged.outcome = Outcome.INCORRECT
        elif judged.outcome == Outcome.OK:
            judged.outcome = Outcome.RUNTIME_FAILED
    if judged.outcome != Outcome.OK:
        judged.failures = _dedupe(judged.failures)
        return judged
    if not any(e["event"] == "done" for e in events):
        judged.outcome = Outcome.CRASHED
        judged.failures = [f"{last}: the test process ended without finishing" + _tail(finished.output)]
        return judged
    if skipped and not passed:
        judged.outcome = Outcome.RUNTIME_FAILED
        judged.failures = [f"all tests skipped: {skipped[0]['message'] or 'see log'}"]
        return judged
    expected = len(tests) * seeds
    if len(passed) < expected:
        judged.outcome = Outcome.RUNTIME_FAILED
        judged.failures = [f"only {len(passed)} of {expected} test runs passed" + _tail(finished.output)]
        return judged
    for e in events:
        if e["event"] == "timing":
            judged.timings.append(Timing(**{k: e[k] for k in Timing.__dataclass_fields__}))
            if e.get("suspect"):
                judged.notes.append(f"suspect: {e['test']}: {e['suspect']}")
    return judged


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
