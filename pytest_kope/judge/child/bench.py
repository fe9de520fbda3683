"""The `kope_bench` fixture's object: pytest glue over the timing core.

In a plain run it times the kernel alone and keeps the stats for the terminal summary. In a judging
child it times the candidate paired with a reference kernel (the incumbent or the baseline).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...errors import GuardViolation
from ...flops import count_flops
from ...settings import Settings
from ...toolchains.base import IN, INOUT, OUT, SCALAR, Kernel, KernelFunction, Timer
from ..arrays import DEFAULT_RTOL
from ..measure import contention, timing
from ..measure.rotation import Rotation, touch_alike
from ..measure.stats import Stats
from ..outcome import Timing
from . import procstate
from .guards import GuardedFunction, PoisonOutputs

if TYPE_CHECKING:
    from ..measure.physics import Ceilings


@dataclass
class BenchRecord:
    """One kernel's timing in a plain run: the test and its median per call."""

    test: str
    function: str
    stats: Stats
    bytes_moved: int


@dataclass
class PairedRecord:
    """One paired timing in a judging child: candidate against reference, interleaved rounds."""

    timing: Timing
    suspect: str = ""  # faster than physics allows: why
    mismatch: str = ""  # the candidate's timed outputs differ from the reference's: why


@dataclass
class BenchSession:
    """Per-process state: what was timed, and the reference kernel when judging a candidate."""

    reference: Kernel | None = None
    plain: list[BenchRecord] = field(default_factory=list)
    paired: list[PairedRecord] = field(default_factory=list)
    physics: Ceilings | None = None  # this machine's measured ceilings: no timing faster than them
    flops: Mapping[str, str] = field(default_factory=dict)  # FLOPs per call, by function (marker `flops=`)
    rtol: float = DEFAULT_RTOL  # timed outputs: candidate against the reference, norm-wise
    settings: Settings = field(default_factory=Settings)  # the run's (a judging child's request's)
    timed_s: float = 0.0  # wall time spent in kope_bench calls (the bench's "timing" phase)
    kernel_s: float = 0.0  # of which inside timed windows (the kernels' own time)


class Bench:
    """The `kope_bench` fixture's callable: times a kernel call with the toolchain's timer."""

    def __init__(self, nodeid: str, timer: Timer, session: BenchSession, skip: Callable[[str], Any]):
        self.nodeid, self.timer, self.session, self._skip = nodeid, timer, session, skip
        # Nothing reads the arguments' outputs after the call (recorded perf inputs, `perfinputs`): the
        # guarded first call may run on the timing's own buffers, and the arguments stay as given.
        self.outputs_unread = False

    def __call__(self, function: Any, *args: Any) -> Any:
        started = time.monotonic()
        try:
            return self._time(function, *args)
        finally:
            self.session.timed_s += time.monotonic() - started

    def _time(self, function: Any, *args: Any) -> Any:
        if not self.timer.can_time:
            self._skip(self.timer.why_not)
        fn = function.function if isinstance(function, GuardedFunction) else None
        if fn is None:
            raise TypeError("kope_bench takes a kernel function, e.g. kope_bench(kernel.softmax, x, y, n)")
        moved = sum(int(getattr(a, "nbytes", 0)) for a in args)
        clock, sync = self.timer.clock, self.timer.sync
        ref = self.session.reference
        roles = [a.role for a in fn.args]
        work = self._work(fn, args)  # before any call: a marker that cannot count fails at once
        if ref is None:
            function(*args)  # one guarded call first: a performance test must not time a broken kernel
            state = procstate.Snapshot.take()  # timed calls are unguarded: checked after
            stats = timing.measure(fn.raw, args, clock, sync, roles=roles)
            _unchanged(state.changes(), f"kernel {fn.name}()")
            self.session.plain.append(BenchRecord(self.nodeid, fn.name, stats, moved))
            return stats
        pair = timing.KernelPair(ref.functions[fn.name].raw, fn.raw, self.session.rtol)
        rotations = _rotations(pair, args, roles)
        if self.outputs_unread:  # the test's own inputs, exactly, on the candidate's first copy
            poisons = any(isinstance(g, PoisonOutputs) for g in function.active_guards)
            rotations[1].prepare(rotations[1].exact(), [0], poison=not poisons)
            function(*rotations[1].sets[0])  # one guarded call first: never time a broken kernel
        else:
            function(*args)  # one guarded call first: a performance test must not time a broken kernel
        states = (_State.of(pair.reference), _State.of(pair.candidate))  # timed calls: checked between
        settings = self.session.settings  # rounds stop once the 95% bound decides the gain, or at the cap
        stop = timing.decided(settings.min_gain) if settings.sequential else None
        pids = tuple(p for k in (pair.reference, pair.candidate) for p in _server_pids(k))
        with contention.Window(pids) as load:  # how busy the machine was meanwhile
            paired = timing.measure_paired(
                pair,
                timing.CallArgs(args, roles),
                timing.Clock(clock, sync),
                budget=replace(timing.PAIRED, max_time_s=settings.timing_s),
                stop=stop,
                rotations=rotations,
                between=lambda candidate: _unchanged(
                    states[candidate].changes(),
                    f"kernel {fn.name}()" if candidate else f"the reference kernel's {fn.name}()",
                ),
            )
        self.session.kernel_s += paired.kernel_s
        ratio, cand_stats = paired.ratio, paired.candidate
        record = Timing(
            self.nodeid,
            paired.reference.median,
            cand_stats.median,
            ratio.median,
            ratio.low,
            ratio.high,
            ratio.rounds,
            moved,
            busy=load.others,
        )
        suspect = self._physics(record, work, paired.copies)
        self.session.paired.append(PairedRecord(record, suspect, paired.mismatch))
        return cand_stats

    def _work(self, fn: KernelFunction, args: tuple[Any, ...]) -> tuple[int, int, float]:
        """The bytes one call must read and write (by its arguments' roles) and the FLOPs the marker
        declares for it from its integer arguments (0: none declared)."""
        read = sum(int(getattr(v, "nbytes", 0)) for a, v in zip(fn.args, args) if a.role in (IN, INOUT))
        written = sum(int(getattr(v, "nbytes", 0)) for a, v in zip(fn.args, args) if a.role in (OUT, INOUT))
        scalars = {a.name: v for a, v in zip(fn.args, args) if a.role == SCALAR}
        flops = count_flops(self.session.flops, fn.name, scalars, self.nodeid) if self.session.flops else 0.0
        return read, written, flops

    def _physics(self, record: Timing, work: tuple[int, int, float], copies: int) -> str:
        """Why the candidate's time is faster than this machine's ceilings allow ("" when it is not, or
        when none were measured); sets the record's bound."""
        caps = self.session.physics
        if caps is None:
            return ""
        from ..measure.physics import Work

        call = Work(work[0], work[1], record.bytes_moved * copies, work[2])  # all copies it cycles through
        record.bound_s = caps.bound(call)
        return caps.check(call, record.candidate_s)


@dataclass
class _State:
    """What a kernel's timed calls must leave as it was: its kernel server's process-wide state
    (the server compares with the state it loaded the kernel in), or this process's."""

    kernel: Any
    snapshot: procstate.Snapshot | None

    @classmethod
    def of(cls, kernel: Any) -> _State:
        return cls(kernel, None if hasattr(kernel, "state") else procstate.Snapshot.take())

    def changes(self) -> list[str]:
        if self.snapshot is not None:
            return self.snapshot.changes()
        found: list[str] = self.kernel.state()
        return found


def _rotations(pair: timing.KernelPair, args: tuple[Any, ...], roles: list[str]) -> tuple[Rotation, Rotation]:
    """Each kernel's copies (in its server's arena), their pages written in turn before either kernel's
    first call (`touch_alike`): neither gets the pages written first."""
    kernels = (pair.reference, pair.candidate)
    reference, candidate = (Rotation(args, roles, allocate=getattr(k, "allocate", None)) for k in kernels)
    touch_alike(reference, candidate)
    return reference, candidate


def _server_pids(kernel: Any) -> list[int]:
    server = getattr(kernel, "server", None)
    return list(server.pids) if server is not None else []


def _unchanged(found: list[str], who: str) -> None:
    """Raise when timed calls left process-wide state changed (`procstate`; the FP state, in any
    thread, is set back): a kernel could set it only when unguarded, slowing or speeding itself."""
    if found:
        raise GuardViolation(f"{who}, in timed calls, " + "; ".join(found))
