"""Time kernels against their peers on the same buffers, interleaved, and against the measured roofline.

    result = compare(CASES["softmax"], [("committed", text, "softmax.c", folder)], build_dir, Setup(threads=2))

Every contender (the kernels given, then the case's peers) writes the one shared output buffer from the
one set of inputs. After a warm-up call (torch.compile compiles there), each contender's output is
checked against the first kernel's (poisoned with NaN before, so an unwritten output fails); one that
does not match is timed but never the best peer. Then rounds: each round times a block of calls of every
contender (the order rotates each round), and a contender's figure is the median per-call time over the
rounds with a distribution-free 95% interval; its speed relative to the best peer is the median of the
per-round ratios (best peer's time / its time, same round) with its interval.

The roof is this machine's, measured in the same rounds on buffers allocated the same way (numpy's,
huge pages where the system gives them), at the same thread count, by `roof.c` built with the
project's C toolchain at -march=native (plus the ISA's flags, as the kernels: `isa_name="avx2"` adds
-mno-avx512f to both and checks each library holds no AVX-512 instruction): STREAM-style copy (libc memcpy per thread, which picks
non-temporal stores for large copies) and read (8 vector accumulators per thread) over the problem's
working set, and the FMA peak (independent chains of vector FMAs in GCC vector extensions). Its median
over the rounds is the roof; each contender's fraction of it is bytes moved / its median time /
bandwidth (copy roof: bytes read + written over the copy rate; read roof: over the read rate), or
FLOPs / time / FMA peak. A kernel with non-temporal stores can pass 1 on a copy roof by a little.
"""

from __future__ import annotations

import ctypes
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..candidate import Candidate
from ..judge.measure.stats import PairedRatio, median_ci
from ..spec import FLAGS, Point, as_point, parse_spec
from ..toolchains.base import Kernel
from ..toolchains.c import CToolchain
from .cases import Call, Case, Problem
from .isa import Isa, isa, loaded_openblas, wide_code

KERNEL, PEER = "kernel", "peer"
ROOF = "roof"


@dataclass(frozen=True)
class Timed:
    """One contender's figures over the rounds."""

    label: str
    kind: str  # KERNEL or PEER
    median_s: float
    low_s: float
    high_s: float
    correct: bool
    error: float  # largest difference from the reference output over its largest magnitude
    roof_fraction: float
    vs_best_peer: float | None = None  # best peer's time / this time, median over rounds
    vs_best_peer_low: float | None = None
    vs_best_peer_high: float | None = None
    params: Point = field(default_factory=dict)  # a kernel's tuning point


@dataclass(frozen=True)
class Comparison:
    """One operator: its contenders, the best peer, the roof and the conditions of the measurement."""

    operator: str
    threads: int
    rounds: int
    roof: str  # copy, read or fma
    roof_value: float  # GB/s or GFLOP/s
    bytes_moved: int
    flops: float
    timed: tuple[Timed, ...]
    best_peer: str | None
    compile_s: float  # torch.compile's compile time (first calls), not timed
    seconds: float  # wall time of this operator's comparison
    isa: str = "native"  # the instruction set kernels were built for and peers ran at (peers/isa.py)

    def get(self, label: str) -> Timed | None:
        return next((t for t in self.timed if t.label == label), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Comparison:
        timed = tuple(Timed(**{**t, "params": as_point(t.get("params", {}))}) for t in data["timed"])
        return cls(**{**data, "timed": timed})


def use_threads(threads: int, torch: Any) -> list[str]:
    """Run torch and numpy's BLAS at `threads` threads through their own calls (the environment stays
    as the user set it); what was set, for the record."""
    done = []
    if torch is not None:
        torch.set_num_threads(threads)
        done.append(f"torch.set_num_threads({threads})")
    for lib in loaded_openblas():
        for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(threads))
                done.append(f"{name}({threads})")
                break
    return done


def build(
    source: str, filename: str, folder: Path, build_dir: Path, at: Isa | None = None
) -> tuple[Kernel, Point]:
    """The kernel of `source` at its declared defaults, built by the project's C toolchain; with `at`,
    its flags follow the point's own (so they win over -march=native) and the library is checked to
    hold none of the instructions `at` forbids. The params returned are the point's own."""
    spec = parse_spec(source, filename)
    params = spec.space.defaults
    built = params
    if at is not None and at.cflags:
        built = {**params, FLAGS: " ".join([str(params.get(FLAGS, "-O2")), *at.cflags])}
    candidate = Candidate(source=source, filename=filename, toolchain="c", params=built, idea="peers")
    kernel = CToolchain().build(candidate, replace(spec, include_dirs=(str(folder),)), build_dir)
    if at is not None:
        wide = wide_code(kernel.extra["library"], at)
        if wide:
            raise RuntimeError(f"{filename} built for {at.name} still has {at.forbidden} code: {wide}")
    return kernel, params


ROOF_C = Path(__file__).with_name("roof.c")
FLOPS_AT = 1024  # roof.c: out[FLOPS_AT + thread] is the FLOPs per rep that thread did
FMA_CALL_S = 0.02  # one FMA probe call at least this long: a thread woken late (4-8 ms on a small VM)
# made a 2 ms call measure half the peak of 2 threads, while a 20 ms sgemm call hardly notices


def roof_call(
    problem: Problem, build_dir: Path, threads: int, at: Isa | None = None
) -> tuple[Call, Callable[[float], float]]:
    """A call of the roof probe for this problem, and the rate (GB/s or GFLOP/s) of a call that took t s."""
    kernel, _ = build(ROOF_C.read_text(), ROOF_C.name, ROOF_C.parent, build_dir, at)
    fns = {name: f.raw for name, f in kernel.functions.items()}
    if problem.roof == "fma":
        out = np.zeros(2 * FLOPS_AT, dtype=np.float32)
        fns["roof_fma"](out, 1, threads)
        reps = 1 << 16
        while _took(fns["roof_fma"], out, reps, threads) < FMA_CALL_S and reps < 1 << 34:
            reps *= 2
        flops = float(out[FLOPS_AT : FLOPS_AT + threads].sum()) * reps
        return (lambda: fns["roof_fma"](out, reps, threads)), (lambda t: flops / t / 1e9)
    if problem.roof == "read":
        a = np.ones(problem.bytes_moved // 4, dtype=np.float32)
        sums = np.zeros(max(threads, 1), dtype=np.float32)
        return (lambda: fns["roof_read"](a, sums, a.size, threads)), (lambda t: a.nbytes / t / 1e9)
    src = np.ones(problem.bytes_moved // 8, dtype=np.float32)
    dst = np.empty_like(src)
    return (lambda: fns["roof_copy"](src, dst, src.size, threads)), (lambda t: 2 * src.nbytes / t / 1e9)


def _took(fn: Callable[..., object], *args: Any) -> float:
    """Seconds one call of `fn(*args)` took."""
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _bound(fn: Callable[..., object], args: tuple[Any, ...]) -> Call:
    return lambda: fn(*args)


QUIET_CPU = 0.2  # the process counts as quiet when its threads use under this share of one CPU
QUIET_MAX_S = 0.5  # ... or after this long: a spinner that never stops must not stall the bench


def _quiet(probe_s: float = 0.005, clock: Any = time) -> float:
    """Wait until no thread of this process burns CPU; the seconds waited.

    Idle pool threads of a library spin before they sleep: OpenBLAS's for 2^28 cycles (~0.1 s) after
    every call. A rotating order keeps the same contender right after numpy every round, so its whole
    block shared the cores with a spinner: 28 ms a call for an 18 ms sgemm, and half the FMA peak.
    `clock` (perf_counter, process_time, sleep) is the `time` module but in tests."""
    start = clock.perf_counter()
    while clock.perf_counter() - start < QUIET_MAX_S:
        cpu = clock.process_time()
        clock.sleep(probe_s)
        if clock.process_time() - cpu < QUIET_CPU * probe_s:
            break
    return float(clock.perf_counter() - start)


def interleave(calls: dict[str, Call], rounds: int, block_s: float) -> dict[str, list[float]]:
    """Per-call seconds of each contender per round; each round one block of calls of every contender,
    in an order that rotates by one each round, each block started on a quiet process (`_quiet`)."""
    iters: dict[str, int] = {}
    for name, fn in calls.items():
        iters[name] = max(1, int(block_s / max(_took(fn), 1e-7)))
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, n = calls[name], iters[name]
            _quiet()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t) / n)
    return times


def _check(call: Call, out: np.ndarray, reference: np.ndarray | None) -> float:
    out.fill(np.nan)
    call()
    if reference is None:
        return 0.0 if np.isfinite(out).all() else float("inf")
    scale = float(np.max(np.abs(reference))) or 1.0
    diff = np.abs(out.astype(np.float64) - reference)
    return float("inf") if not np.isfinite(diff).all() else float(diff.max()) / scale


@dataclass(frozen=True)
class Setup:
    """How a comparison runs: every contender's thread count, the interleaved rounds and each block's
    length, the inputs' seed, whether the torch.compile peers join (their first compile takes 10-60 s),
    and the instruction set the kernels and the roof probe are built for (peers/isa.py)."""

    threads: int
    rounds: int = 15
    block_s: float = 0.05
    seed: int = 0
    compiled: bool = True
    isa_name: str = "native"


def compare(
    case: Case,
    kernels: Sequence[tuple[str, str, str, Path]],
    build_dir: Path,
    setup: Setup,
    torch: Any = None,
    log: Callable[[str], None] = lambda _: None,
) -> Comparison:
    """Time `kernels` ((label, source text, file name, folder), the first is the reference output)
    against the case's peers on shared buffers; see the module doc. The peers' own settings (threads,
    instruction set) are the caller's to make before torch and numpy load."""
    at = isa(setup.isa_name)
    # torch imports parts of itself lazily on first use, some with deprecation warnings of its own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        result = _compare(case, kernels, build_dir, setup, torch, log, at)
    return replace(result, isa=at.name)


def _ready(
    case: Case, problem: Problem, calls: dict[str, Call], log: Callable[[str], None]
) -> tuple[dict[str, float], float]:
    """Call each kernel and peer once: its error against the first (the committed kernel), and the
    seconds torch.compile took on its first calls."""
    errors: dict[str, float] = {}
    reference = None
    compile_s = 0.0
    for label, fn in calls.items():
        t = time.perf_counter()
        errors[label] = _check(fn, problem.out, reference)
        if label in problem.compiled:
            compile_s += time.perf_counter() - t
        if reference is None:
            reference = problem.out.astype(np.float64)
        log(f"{case.name}: {label} ready (error {errors[label]:.2g})")
    return errors, compile_s


def _compare(
    case: Case,
    kernels: Sequence[tuple[str, str, str, Path]],
    build_dir: Path,
    setup: Setup,
    torch: Any,
    log: Callable[[str], None],
    at: Isa,
) -> Comparison:
    start = time.monotonic()
    problem = case.make(np.random.default_rng(setup.seed), torch)
    calls: dict[str, Call] = {}
    kinds: dict[str, str] = {}
    params: dict[str, Point] = {}
    for label, text, filename, folder in kernels:
        kernel, params[label] = build(text, filename, folder, build_dir, at)
        if not case.matches(tuple(parse_spec(text, filename).kernels)):
            raise ValueError(f"{label}: {filename} does not declare {case.name}'s prototype {case.prototype}")
        calls[label], kinds[label] = _bound(kernel.functions[case.name].raw, problem.args), KERNEL
    for label, fn in {**problem.peers, **(problem.compiled if setup.compiled else {})}.items():
        calls[label], kinds[label] = fn, PEER
    errors, compile_s = _ready(case, problem, calls, log)
    correct = {label: errors[label] <= case.rtol for label in calls}
    probe, rate_of = roof_call(problem, build_dir, setup.threads, at)
    times = interleave({**calls, ROOF: probe}, setup.rounds, setup.block_s)
    peak = rate_of(statistics.median(times.pop(ROOF)))
    medians = {label: statistics.median(ts) for label, ts in times.items()}
    peers = [label for label in calls if kinds[label] == PEER and correct[label]]
    best = min(peers, key=medians.__getitem__) if peers else None
    timed = []
    for label, ts in times.items():
        low, high = median_ci(ts)
        rate = (
            problem.flops / medians[label] / 1e9
            if problem.roof == "fma"
            else problem.bytes_moved / medians[label] / 1e9
        )
        ratio = PairedRatio.of(times[best], ts) if best is not None else None
        timed.append(
            Timed(
                label, kinds[label], medians[label], low, high, correct[label], errors[label], rate / peak,
                ratio.median if ratio else None, ratio.low if ratio else None, ratio.high if ratio else None,
                params.get(label, {}),
            )
        )  # fmt: skip
    return Comparison(
        case.name, setup.threads, setup.rounds, problem.roof, peak, problem.bytes_moved, problem.flops, tuple(timed), best,
        compile_s, time.monotonic() - start,
    )  # fmt: skip
