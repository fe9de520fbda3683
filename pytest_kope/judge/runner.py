"""Judge candidates of one operator: correctness in parallel, performance one at a time, verification.

Every judgement is a fresh `pytest` child in the sandbox, running the operator's own tests with the
candidate as the `kernel` fixture's parameter; it reports back as signed, typed events
(`protocol.py`), and only this process (the controller) interprets them and writes the graph.

The committed kernel's own correctness run also records its calls for the differential check
(`differential.py`); every candidate replays them, and this process compares the outputs.
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
from ..errors import SpecError
from ..operator import Operator, interface_change
from ..spec import parse_spec
from ..toolchains.devices import visible_devices_env
from . import differential, sandbox
from .arrays import DEFAULT_RTOL
from .outcome import Judged, Outcome, Timing
from .protocol import read_events


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
    ceilings: dict[str, Any] | None = None  # measured bandwidth/FMA ceilings, for host-timed kernels


class Judge:
    def __init__(self, plan: Plan, screen):
        self.plan = plan
        self.screen = screen  # toolchain.screen
        self.free_devices: queue.Queue[int | None] = queue.Queue()
        for device in plan.devices or (None,):
            self.free_devices.put(device)
        self.recorded: Path | None = None  # the committed kernel's recorded calls (inputs only on disk)
        self.expected: dict[str, dict[str, Any]] = {}  # its outputs, held here, never on disk
        self.committed: Candidate | None = None

    def baseline(self, candidate: Candidate) -> Judged:
        """The committed kernel's correctness run; it also records the differential check's inputs.

        Called again before verification, so the winner is re-checked on inputs it has never seen.
        """
        self.close()
        self.committed = candidate
        folder = Path(tempfile.mkdtemp(prefix=f"kope-{self.plan.operator.name}-calls-"))
        judged = self._child(candidate, self.plan.correctness, self._draw_seeds(), None, record=folder)
        if judged.outcome == Outcome.INCORRECT and _only_seeded(judged):
            # the committed kernel fails a test only on some fresh inputs: the test is flaky there
            first = judged
            judged = self._child(candidate, self.plan.correctness, self._draw_seeds(), None, record=folder)
            if judged.outcome.correct:
                judged.notes += [
                    f"flaky test: {t} fails the committed kernel with --kope-seed {s}; fix its tolerance"
                    for t, s in sorted(set(first.failed_runs))
                ]
        if judged.outcome.correct and (folder / "manifest.json").exists():
            self.recorded, self.expected = folder, differential.take_expected(folder)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        return judged

    def _draw_seeds(self) -> list[int]:
        """Fresh seeds for one correctness run (`--kope-seeds` of them)."""
        return [random.SystemRandom().randrange(1 << 31) for _ in range(max(1, self.plan.seeds))]

    def close(self) -> None:
        if self.recorded is not None:
            shutil.rmtree(self.recorded, ignore_errors=True)
        self.recorded, self.expected = None, {}

    def correctness(self, candidates: list[Candidate]) -> list[Judged]:
        devices = self.plan.devices or (None,)
        jobs = [(c, devices[i % len(devices)]) for i, c in enumerate(candidates)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.plan.jobs, len(candidates)))) as pool:
            return list(pool.map(lambda job: self._correctness_one(*job), jobs))

    def _correctness_one(self, candidate: Candidate, device: int | None = None) -> Judged:
        reasons = self.screen(candidate) + _interface_reasons(self.plan.operator, candidate)
        if reasons:
            return Judged(candidate, Outcome.REJECTED, failures=[f"screening: {r}" for r in reasons])
        judged = self._child(
            candidate, self.plan.correctness, self._draw_seeds(), reference=None, device=device
        )
        if judged.outcome == Outcome.INCORRECT and judged.failed_runs and self.committed is not None:
            self._forgive_flaky(judged, device)
        if judged.outcome.correct and judged.differential:
            judged.outcome = Outcome.INCORRECT
            judged.failures = judged.differential[:3]
        return judged

    def _forgive_flaky(self, judged: Judged, device: int | None) -> None:
        """A test the committed kernel also fails on the same seed is the test's fault, not the candidate's.

        Each failing (test, seed) is re-run with the committed kernel: same seed, same inputs. When every
        failure is one the committed kernel shares, the candidate is judged as if those tests had passed,
        and the report names the tests to fix and the seeds that show it.
        """
        failing = sorted(set(judged.failed_runs))
        if not _only_seeded(judged) or len(failing) > 4:
            return  # a failure without fresh inputs, or many: not a flaky tolerance
        flaky = []
        for test, seed in failing:
            again = self._child(self.committed, [test], [seed], None, device=device, replay=False)
            if again.outcome != Outcome.INCORRECT or (test, seed) not in set(again.failed_runs):
                return
            flaky.append(
                f"flaky test: {test} fails the committed kernel too with --kope-seed {seed}; fix its tolerance"
            )
        judged.outcome = Outcome.OK
        judged.notes += flaky
        judged.failures = []

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
        if timed.outcome == Outcome.SUSPECT:
            judged.outcome = Outcome.SUSPECT
        return judged

    def _child(
        self,
        candidate: Candidate,
        tests: list[str],
        seeds: list[int],
        reference: Candidate | None,
        device: int | None = None,
        record: Path | None = None,
        replay: bool = True,
    ) -> Judged:
        plan = self.plan
        replay_from = self.recorded if reference is None and record is None and replay else None
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
                "operator": plan.operator.to_json(),
                "record": str(record) if record else None,
                "replay": str(replay_from) if replay_from else None,
                "rtol": self.rtol,
                "ceilings": plan.ceilings if reference is not None else None,
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
                    **(_oversubscribed(plan.toolchain_env) if reference is None else {}),
                },
                work,
            )
            try:
                finished = sandbox.run(
                    cmd, work, env, plan.limits, writable=[record] if record else (), pass_fds=(key_r,)
                )
            finally:
                os.close(key_r)
            events, forged = read_events(results, key)
            judged = interpret(candidate, finished, events, tests)
            if replay_from is not None and judged.outcome in (Outcome.OK, Outcome.INCORRECT):
                judged.differential = self._compare(events, replay_from, work / "replayed")
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

    @property
    def rtol(self) -> float:
        return self.plan.operator.rtol or DEFAULT_RTOL

    def _compare(self, events: list[dict[str, Any]], replay: Path, outputs: Path) -> list[str]:
        """The differential check's findings, decided here from the candidate's outputs alone."""
        done = [e for e in events if e["event"] == "replayed"]
        problems = (
            done[-1]["problems"] if done else ["the candidate's child never replayed the recorded calls"]
        )
        return [str(p) for p in problems] or differential.compare(replay, self.expected, outputs, self.rtol)


def _only_seeded(judged: Judged) -> bool:
    return bool(judged.failed_runs) and all(seed is not None for _, seed in judged.failed_runs)


def _interface_reasons(op: Operator, candidate: Candidate) -> list[str]:
    try:
        change = interface_change(op.spec, parse_spec(candidate.source, candidate.filename))
    except SpecError as e:
        return [str(e)]
    return [f"the candidate {change}; the interface stays the committed one"] if change else []


def _oversubscribed(toolchain_env: dict[str, str]) -> dict[str, str]:
    """More OpenMP threads than cores in correctness children: races show up more often."""
    if "OMP_NUM_THREADS" in toolchain_env or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(4 * max(1, len(os.sched_getaffinity(0))))}


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
