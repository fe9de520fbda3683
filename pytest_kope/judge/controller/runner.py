"""Judge candidates of one operator: correctness in parallel, performance one at a time, verification.

Every judgement is a `pytest` child in the sandbox, running the operator's own tests with the
candidate as the `kernel` fixture's parameter: forked from a warm fork server, or started fresh
(`launch.py`). It reports back as signed, typed events (`protocol.py`), and only this process (the
controller) interprets them and writes the graph.

The committed kernel's own correctness run also records its calls for the differential check
(`differential.py`); every candidate replays them, and this process compares the outputs.
"""

from __future__ import annotations

import json
import queue
import random
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...candidate import Candidate
from ...errors import InfrastructureFault, SpecError
from ...operator import Operator, interface_change
from ...spec import parse_spec
from ..arrays import DEFAULT_RTOL, timed_rtol
from ..child import drawing
from ..outcome import Judged, Outcome
from . import environments
from .judgement import Request
from .launch import Launcher
from .plan import Plan
from .recording import Differential, Recording, said_bar
from .verdict import replay_outcome

SANITIZED = "built with -fsanitize=address,undefined"


class Judge:
    """Judges candidates for one operator: correctness in parallel children, then paired timing."""

    def __init__(self, plan: Plan, screen: Callable[[Candidate], list[str]]):
        self.plan = plan
        self.screen = screen  # toolchain.screen
        self.free_devices: queue.Queue[int | None] = plan.timing_slots or queue.Queue()
        if plan.timing_slots is None:
            for device in plan.devices or (None,):
                self.free_devices.put(device)
        # the committed kernel's recorded calls: inputs on disk, manifests and outputs held here
        self.recording: Recording | None = None
        self._stale: list[Path] = []  # recordings replaced while children may still read them
        self._recording_lock = threading.RLock()  # held while the calls are recorded afresh
        self.committed: Candidate | None = None
        self.launcher = Launcher(plan)
        self.sanitizing = bool(plan.sanitize_env)  # off once the committed kernel fails its sanitized run
        self.timed_rtol = (DEFAULT_RTOL, "not known before the committed kernel's run")  # (rtol, why)
        # measures this machine's ceilings again (they only rise) and returns them: set by the loop,
        # called before a `suspect` verdict stands, since a probe run on a busy machine measures low
        self.remeasure: Callable[[], dict[str, Any] | None] | None = None

    @property
    def ceilings(self) -> dict[str, Any] | None:
        """The machine's ceilings the judge holds timings to now (the plan's, or higher ones measured
        again before a `suspect` verdict stood)."""
        return self.launcher.ceilings

    def fresh_processes(self) -> None:
        """Judge in fresh processes from now on, each building its own kernels: the verification of a
        winner, where independence from everything before matters more than speed."""
        self.launcher.fresh_processes()

    @property
    def notes(self) -> list[str]:
        """What the launcher had to say (fork servers off or restarted), for the run's output."""
        return self.launcher.notes

    def baseline(self, candidate: Candidate) -> Judged:
        """The committed kernel's correctness run; it also records the differential check's inputs.

        Called again before verification, so the winner is re-checked on inputs it has never seen.
        """
        self._forget()
        self.committed = candidate
        folder = Path(tempfile.mkdtemp(prefix=f"kope-{self.plan.operator.name}-calls-"))
        try:
            judged = self._everywhere(candidate, self._draw_seeds(), record=folder)
            if judged.outcome == Outcome.INCORRECT and _only_seeded(judged):
                # the committed kernel fails a test only on some fresh inputs: the test is flaky there
                first = judged
                judged = self._everywhere(candidate, self._draw_seeds(), record=folder)
                if judged.outcome.correct:
                    judged.notes += [
                        f"flaky test: {t} fails the committed kernel with --kope-seed {s}; fix its tolerance"
                        for t, s in sorted(set(first.failed_runs))
                    ]
        except BaseException:  # an interruption: the folder is no recording yet, nothing else removes it
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if judged.outcome.correct and (folder / "manifest.json").exists():
            self.recording = Recording.take(folder)
            notes = folder / "notes.json"
            judged.notes += json.loads(notes.read_text()) if notes.exists() else []
        else:
            shutil.rmtree(folder, ignore_errors=True)
        if judged.outcome.correct:  # the bar for timed outputs: the repo's own tolerance
            self.timed_rtol = timed_rtol(self.plan.operator.rtol, judged.asserted)
            self.launcher.timed_rtol = self.timed_rtol[0]
            self._sanitizer_holds(judged)
        if not judged.outcome.correct:
            self.launcher.close()  # the operator stops here: no server need stay warm
        return judged

    def _sanitizer_holds(self, committed: Judged) -> None:
        """The committed kernel passes the sanitized run, or no candidate is held to it (the machine
        cannot run it, or the repo's kernel has a memory error of its own: the report says which)."""
        if not self.sanitizing:
            return
        passed = Judged(committed.candidate, Outcome.OK)
        self._sanitized(passed, None)
        if not passed.outcome.correct:
            self.sanitizing = False
            committed.notes.append(
                f"no sanitized runs: the committed kernel fails one: {passed.reason[:400]}"
            )

    def _draw_seeds(self) -> list[int]:
        """Fresh seeds for one correctness run (`--kope-seeds` of them, one per environment at least)."""
        count = max(len(environments.ENVIRONMENTS), self.plan.settings.seeds)
        return [random.SystemRandom().randrange(1 << 31) for _ in range(count)]

    @property
    def recorded(self) -> Path | None:
        """The folder of the committed kernel's recorded calls, which candidates replay."""
        return self.recording.folder if self.recording is not None else None

    def _forget(self) -> None:
        if self.recording is not None:
            self._stale.append(self.recording.folder)  # a child judged now may still replay from it
        self.recording = None

    def _recording_for(self) -> Recording | None:
        """The recording a child replays; after a child changed it (possible only unjailed), recorded
        afresh first, while every other child waits for the whole new one."""
        with self._recording_lock:
            if self.recording is not None and self.recording.changed() and self.committed is not None:
                self.baseline(self.committed)
            return self.recording

    def close(self) -> None:
        """Forget the recorded calls, stop the fork servers, remove the build cache."""
        self._forget()
        for folder in self._stale:
            shutil.rmtree(folder, ignore_errors=True)
        self._stale.clear()
        self.launcher.close()

    def correctness(self, candidates: list[Candidate]) -> list[Judged]:
        devices = self.plan.devices or (None,)
        jobs = [(c, devices[i % len(devices)]) for i, c in enumerate(candidates)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.plan.jobs, len(candidates)))) as pool:
            return list(pool.map(lambda job: self._correctness_one(*job), jobs))

    def _correctness_one(self, candidate: Candidate, device: int | None = None) -> Judged:
        reasons = self.screen(candidate) + _interface_reasons(self.plan.operator, candidate)
        if reasons:
            return Judged(candidate, Outcome.REJECTED, failures=[f"screening: {r}" for r in reasons])
        try:
            judged = self._everywhere(
                candidate, self._draw_seeds(), device, forgive=self.committed is not None
            )
            if judged.outcome.correct and not judged.differential and self.sanitizing:
                self._sanitized(judged, device)
        except InfrastructureFault as e:  # the machinery's failure: no verdict on the candidate
            return Judged(candidate, Outcome.RUNTIME_FAILED, failures=[str(e)], fault=str(e))
        if judged.outcome.correct and judged.differential:
            judged.outcome = replay_outcome(judged.replay_died)
            judged.failures = judged.differential[:3]
            self._shrink(judged, device)
        judged.bar = said_bar(*self.timed_rtol, self.recording)  # which bar judged it, for the report
        return judged

    def _sanitized(self, judged: Judged, device: int | None) -> None:
        """A candidate that passed runs its tests and the recorded calls once more, built and served
        sanitized (`toolchains/sanitize.py`): what the sanitizers report fails it, with their lines."""
        seed = self._draw_seeds()[:1]
        once = self._child(
            Request(judged.candidate, self.plan.correctness, seed, device=device, sanitize=True)
        )
        if once.outcome == Outcome.INCORRECT and once.failed_runs:
            self._forgive_flaky(once, device, environments.USER)
        judged.seconds += once.seconds  # one phase of its own, its build included (the bench shows it apart)
        judged.phases["sanitized"] = once.seconds
        found = once.failures if not once.outcome.correct else once.differential
        if found:
            judged.outcome = once.outcome if not once.outcome.correct else replay_outcome(once.replay_died)
            judged.failures = [f"{SANITIZED}: {f}" for f in found[:3]]

    def _shrink(self, judged: Judged, device: int | None) -> None:
        """A failure on a drawn call gets the minimal input Hypothesis shrinks it to, in a child holding
        the candidate and the committed kernel (`drawing.shrink`). Only the message changes: the
        verdict was made here from the candidate's outputs."""
        key = drawing.failing_key(judged.failures[0])
        if key is None or self.recorded is None or self.committed is None:
            return
        request = Request(judged.candidate, [], [], None, device, None, self.recorded)
        shrunk = self.launcher.judge(replace(request, shrink=key, oracle=self.committed))
        judged.seconds += shrunk.seconds
        judged.phases["shrink"] = shrunk.seconds
        if shrunk.shrunk:
            judged.failures[0] += f"; minimal input (shrunk by Hypothesis): {shrunk.shrunk}"

    def _everywhere(
        self,
        candidate: Candidate,
        seeds: list[int],
        device: int | None = None,
        record: Path | None = None,
        forgive: bool = False,
    ) -> Judged:
        """All correctness tests in each environment (`environments.py`), each on its share of `seeds`;
        the first environment that fails decides, and its failures name it. The committed kernel's
        calls are recorded in the user's environment; every environment replays them."""
        judged: Judged | None = None
        for environment, share in environments.share(seeds):
            here = record if environment == environments.USER else None  # recorded where users run
            request = Request(candidate, self.plan.correctness, share, device=device, record=here)
            one = self._child(replace(request, environment=environment))
            if forgive and one.outcome == Outcome.INCORRECT and one.failed_runs:
                self._forgive_flaky(one, device, environment)
            if environment != environments.USER:
                where = environments.describe(environment)
                one.failures = [f"{where}: {f}" for f in one.failures]
                one.differential = [f"{where}: {f}" for f in one.differential]
            judged = one if judged is None else _joined(judged, one)
            if not judged.outcome.correct or judged.differential:
                break  # the candidate is out: the other environment would only cost time
        assert judged is not None  # there is an environment
        return judged

    def _forgive_flaky(self, judged: Judged, device: int | None, environment: str) -> None:
        """A test the committed kernel also fails on the same seed is the test's fault, not the candidate's.

        Each failing (test, seed) is re-run with the committed kernel: same seed, same inputs. When every
        failure is one the committed kernel shares, the candidate is judged as if those tests had passed,
        and the report names the tests to fix and the seeds that show it.
        """
        failing = sorted((test, seed) for test, seed in set(judged.failed_runs) if seed is not None)
        if self.committed is None or not _only_seeded(judged) or len(failing) > 4:
            return  # a failure without fresh inputs, or many: not a flaky tolerance
        flaky = []
        for test, seed in failing:
            again = self._child(
                Request(self.committed, [test], [seed], device=device, environment=environment), replay=False
            )
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
            timing = Request(judged.candidate, self.plan.performance, [], reference, device=device)
            timed = self._child(timing)
            if timed.outcome == Outcome.SUSPECT and self._ceilings_rose():
                judged.add_time(timed)
                judged.notes.append(
                    "timed again: faster than the ceilings allowed, which measured higher again"
                )
                timed = self._child(timing)
        except InfrastructureFault as e:
            judged.fault, judged.failures = str(e), [str(e)]
            return judged
        finally:
            self.free_devices.put(device)
        judged.add_time(timed)
        if not timed.outcome.correct and timed.outcome != Outcome.SUSPECT:
            judged.outcome, judged.failures = timed.outcome, timed.failures
            return judged
        judged.timings = timed.timings
        judged.notes += timed.notes  # a suspect's: which physics bound its time broke
        if timed.outcome == Outcome.SUSPECT:
            judged.outcome = Outcome.SUSPECT
        return judged

    def _ceilings_rose(self) -> bool:
        """Whether the ceilings, measured again, are higher than the ones the timing was held to."""
        before = self.launcher.ceilings
        if self.remeasure is None or not before:
            return False
        after = self.remeasure()
        if after is None or all(after.get(k) == before.get(k) for k in ("read", "write", "copy", "gflops")):
            return False
        self.launcher.ceilings = after
        return True

    def _child(self, request: Request, replay: bool = True) -> Judged:
        """One child's verdict on `request`; a correctness child that records nothing replays the
        committed kernel's recorded calls (the differential check) unless `replay` is off."""
        correctness = request.reference is None and request.record is None
        recording = self._recording_for() if correctness and replay else None
        if recording is not None:
            checked = Differential(recording, self.rtol, drawn=not request.sanitize)
            request = replace(request, replay_from=recording.folder, differential=checked)
        return self.launcher.judge(request)

    @property
    def rtol(self) -> float:
        """The bar every output check uses, replayed, drawn and timed: the repo's own precision."""
        return self.timed_rtol[0]


def _joined(first: Judged, then: Judged) -> Judged:
    """One verdict from two correctness children of one candidate: the later child's outcome (the
    earlier passed, else it would not have run), both children's time, tests, notes and findings."""
    then.add_time(first)
    then.tests_passed = sorted(set(first.tests_passed) & set(then.tests_passed))
    then.notes = first.notes + then.notes
    then.differential = first.differential + then.differential
    then.replay_died = then.replay_died or first.replay_died
    then.fixed_inputs = sorted(set(first.fixed_inputs) | set(then.fixed_inputs))
    then.asserted = then.asserted or first.asserted
    return then


def _only_seeded(judged: Judged) -> bool:
    return bool(judged.failed_runs) and all(seed is not None for _, seed in judged.failed_runs)


def _interface_reasons(op: Operator, candidate: Candidate) -> list[str]:
    try:
        change = interface_change(op.spec, parse_spec(candidate.source, candidate.filename))
    except SpecError as e:
        return [str(e)]
    return [f"the candidate {change}; the interface stays the committed one"] if change else []
