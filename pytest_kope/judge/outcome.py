"""The verdict on one candidate, shared by the judge, the agents, the graph and the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..candidate import Candidate


class Outcome(str, Enum):
    """How a judged candidate ended (after Kernel Tuner's ErrorConfig family)."""

    BETTER = "better"  # correct, and faster than the incumbent beyond noise: the new incumbent
    OK = "ok"  # correct, not faster beyond noise
    INCORRECT = "incorrect"  # a correctness test failed (including oracle guard violations)
    COMPILE_FAILED = "compile_failed"
    RUNTIME_FAILED = "runtime_failed"  # raised or errored in a test
    CRASHED = "crashed"  # killed by a signal (segfault, abort) or ran out of memory
    TIMEOUT = "timeout"  # wall-clock or CPU limit
    REJECTED = "rejected"  # static screening refused it before the build
    SUSPECT = "suspect"  # timed faster than physics allows; re-checked, never crowned

    @property
    def correct(self) -> bool:
        return self in (Outcome.BETTER, Outcome.OK)


@dataclass
class Timing:
    """One performance test, candidate timed paired with a reference in one process."""

    test: str
    reference_s: float  # median seconds of the reference (incumbent or baseline)
    candidate_s: float
    ratio: float  # median of per-round reference/candidate; > 1 means the candidate is faster
    ratio_low: float  # lower confidence bound of that median
    ratio_high: float
    rounds: int
    bytes_moved: int = 0
    bound_s: float = 0.0  # the shortest time this machine's measured ceilings allow the call (0: none)
    busy: float | None = None  # share of the machine's CPU time others used meanwhile (`contention`)

    @property
    def of_medians(self) -> float:
        """Reference median over candidate median, from the same paired rounds: the ratio a reader
        gets by dividing the two times shown beside it (the 95% bound is the per-round ratio's)."""
        return self.reference_s / self.candidate_s if self.candidate_s > 0 else float("inf")


@dataclass
class Judged:
    """The verdict on one candidate: outcome, failures, timings and notes."""

    candidate: Candidate
    outcome: Outcome
    failures: list[str] = field(default_factory=list)  # "test id: trimmed message"
    build_log: str = ""
    timings: list[Timing] = field(default_factory=list)
    tests_passed: list[str] = field(default_factory=list)
    speedup: float | None = None  # against the original baseline (product of ratios along the lineage)
    seconds: float = 0.0  # wall time spent judging
    notes: list[str] = field(default_factory=list)
    # not stored: what the judge needs between steps of one judgement
    failed_runs: list[tuple[str, int | None]] = field(default_factory=list, repr=False)  # (test, seed)
    differential: list[str] = field(default_factory=list, repr=False)  # the differential check's findings
    replay_died: str = field(
        default="", repr=False
    )  # KernelDied/KernelTimeout: its server died in the replay
    fixed_inputs: list[str] = field(default_factory=list, repr=False)  # tests that make their own inputs
    shrunk: str = field(default="", repr=False)  # a shrinking child's minimal failing input (`draws.py`)
    phases: dict[str, float] = field(default_factory=dict, repr=False)  # seconds by phase, for the bench
    fault: str = field(default="", repr=False)  # lost to the machinery (InfrastructureFault): no verdict
    # the loosest norm-wise bound its tests' assert_close calls set, and the largest error they saw
    asserted: tuple[float, float] | None = field(default=None, repr=False)
    bar: str = field(
        default="", repr=False
    )  # the tolerance its outputs were held to, and whence (the report's)

    def add_time(self, other: Judged) -> None:
        """Count another child's wall time and phases in this verdict (one candidate, several children)."""
        self.seconds += other.seconds
        for phase, seconds in other.phases.items():
            self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    @property
    def ratio(self) -> float | None:
        return _geomean([t.ratio for t in self.timings]) if self.timings else None

    @property
    def ratio_low(self) -> float | None:
        return _geomean([t.ratio_low for t in self.timings]) if self.timings else None

    @property
    def paired_times(self) -> tuple[float, float] | None:
        """(reference, candidate): the summed medians of its performance tests, from the same paired
        rounds, so that reference / candidate is the speedup every report gives for a verified winner."""
        if not self.timings:
            return None
        return sum(t.reference_s for t in self.timings), sum(t.candidate_s for t in self.timings)

    @property
    def busy(self) -> float | None:
        """The largest share of the machine others used during any of its timings (None: unknown)."""
        known = [t.busy for t in self.timings if t.busy is not None]
        return max(known) if known else None

    @property
    def time_s(self) -> float | None:
        return sum(t.candidate_s for t in self.timings) if self.timings else None

    @property
    def reason(self) -> str:
        """Why the verdict is what it is, in one line: the first failure, the physics bound a suspect
        time broke, or the paired ratio that made (or did not make) a correct candidate a gain."""
        if self.outcome == Outcome.SUSPECT:
            why = next((n for n in self.notes if n.startswith("suspect: ")), "")
            return why.removeprefix("suspect: ") or "timed faster than physics allows"
        if self.failures:
            return self.failures[0]
        if not self.outcome.correct:
            return str(self.outcome.value)
        if self.ratio is None or self.ratio_low is None:
            return "passed every correctness test; no performance test timed it"
        high = _geomean([t.ratio_high for t in self.timings])
        bound = f"{self.ratio:.3f}x the incumbent, 95% interval [{self.ratio_low:.3f}, {high:.3f}]"
        if self.outcome == Outcome.BETTER:
            return f"correct and faster beyond noise: {bound}"
        return f"correct, not faster beyond noise: {bound}"

    def summary(self) -> str:
        """One line for humans and for the LLM's next turn."""
        head = f"{self.candidate.short} {self.outcome.value}"
        if self.ratio is not None:
            head += f" {self.ratio:.2f}x vs incumbent (low {self.ratio_low:.2f})"
        if self.failures:
            head += f": {self.failures[0]}"
        return head


def _geomean(xs: list[float]) -> float:
    import math

    return math.exp(sum(math.log(max(x, 1e-12)) for x in xs) / len(xs))
