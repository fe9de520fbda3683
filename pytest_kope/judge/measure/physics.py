"""No time faster than physics: this machine's measured bandwidth and FMA ceilings, and the check.

A timed call that must read R bytes and write W bytes of a footprint in t seconds cannot have read,
written or moved them faster than this machine does for data of that footprint; a call doing F FLOPs
cannot beat the FMA peak. A kernel that "returns at once" from a cache breaks them by orders of
magnitude, one that skips two thirds of its reads by 3x: the margins allowed past the ceilings come
from the probe's own spread, over floors measured on honest kernels (`Ceilings.margin`).

    caps = ceilings_for(graph, fingerprint, kope_dir / "builds")   # measured once per hardware
    reason = caps.check(Work(read=n * 4, written=n * 4, working_set=4 * n * 4, flops=n), seconds=t)
    if reason: ...  # the candidate's time is impossible: reject it with `reason`

The ceilings come from a small C probe (gcc -O3 -march=native -fopenmp), built once per compiler and
CPU into `build_dir/physics-<hash>/`: for working sets from 16 KiB to 4x the last-level cache it
takes the best-of-N read (vector sum, 8 accumulators), write (memset) and copy (memcpy) bandwidth of
all threads, on huge-page buffers (the faster case numpy gets), and the float32 FMA peak (12
independent FMA chains of the widest vectors -march=native allows, on every thread), each with its
spread (best over median sample).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...errors import KopeError
from ...hardware import cpu_fingerprint
from ...toolchains.c import compiler_version
from .caches import cache_sizes, last_level_cache_bytes, llc_instances

SMALLEST = 16 << 10
FORMAT_VERSION = 2  # 2 added the spreads; a version-1 record loads with none (the floors apply)
# The least margin over a ceiling an honest call is allowed, whatever the probe's own spread (see
# Ceilings.margin for the measurements behind them).
BANDWIDTH_FLOOR = 2.0
FLOPS_FLOOR = 2.0


@dataclass(frozen=True)
class Work:
    """What one timed call does: the bytes it must read (inputs, in-place arguments) and write
    (outputs, in-place arguments), the footprint of all the buffers it cycles through, its FLOPs."""

    read: int
    written: int
    working_set: int
    flops: float = 0.0


class PhysicsProbeFailed(KopeError):
    """The bandwidth probe could not be built or run on this machine."""


# -- the probe ----------------------------------------------------------------------------------------

PROBE_C = Path(__file__).with_name("physics_probe.c")
FLAGS = ["-O3", "-march=native", "-fopenmp"]


def build_probe(build_dir: Path) -> Path:
    """The probe executable, compiled once per source, compiler and CPU under build_dir/physics-<hash>/."""
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise PhysicsProbeFailed(
            f"no C compiler {cc!r} on PATH to build the bandwidth probe (install gcc or set CC)"
        )
    # -march=native code is only valid on this CPU: a build cache shared between machines keys on it
    key = json.dumps(
        [PROBE_C.read_text(), FLAGS, compiler_version(cc), cpu_fingerprint()], sort_keys=True, default=str
    )
    exe = Path(build_dir) / f"physics-{hashlib.sha256(key.encode()).hexdigest()[:12]}" / "probe"
    if exe.is_file():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=exe.parent) as tmp:
        src, out = Path(tmp, "probe.c"), Path(tmp, "probe")
        src.write_text(PROBE_C.read_text())
        proc = subprocess.run(
            [cc, *FLAGS, str(src), "-o", str(out)], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise PhysicsProbeFailed(
                f"{cc} {' '.join(FLAGS)} could not build the bandwidth probe:\n{proc.stderr}"
            )
        os.replace(out, exe)  # atomic: a concurrent builder sees the whole file or none
    return exe


def working_sets(caches: Mapping[str, int], llc_instances: int = 1) -> list[int]:
    """16 KiB, x4, ... up to 4x the (aggregate) last-level cache, capped at a quarter of free memory."""
    top = 4 * last_level_cache_bytes(caches) * llc_instances
    try:
        top = min(top, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
    except (ValueError, OSError):
        pass
    sizes = [SMALLEST]
    while sizes[-1] * 4 < top:
        sizes.append(sizes[-1] * 4)
    return sizes + [top] if top > sizes[-1] else sizes


def _size(n: float) -> str:
    return next(
        f"{n / s:.3g} {u}" for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")) if n >= s or s == 1
    )


def _rate(per_s: float) -> str:
    return next(
        f"{per_s / s:.3g} {u}"
        for s, u in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1, ""))
        if per_s >= s or s == 1
    )


def _times(x: float) -> str:
    return f"{x:.3g}" if x < 1000 else f"{x:.0f}"


def _duration(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one machine: GB/s per working-set size (read, write, copy), GFLOP/s FMA."""

    sizes: tuple[int, ...]
    read: tuple[float, ...]
    write: tuple[float, ...]
    copy: tuple[float, ...]
    gflops: float
    threads: int = 0
    caches: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # how long measuring took
    # best over median sample of the probe's repetitions, per size (the largest of the three figures)
    # and for the FMA peak: how steady the machine measured; () and 0: not measured (a version-1 record)
    spread: tuple[float, ...] = ()
    gflops_spread: float = 0.0

    @classmethod
    def measure(cls, build_dir: Path, sizes: list[int] | None = None, best_of: int = 7) -> Ceilings:
        """Build (once) and run the probe here: 0.4-1.1 s on this project's 2-core VM, idle to loaded."""
        caches = cache_sizes()
        sizes = sizes or working_sets(caches, llc_instances())
        # all CPUs; passive waits: a thread spinning at a barrier on a loaded machine steals the core
        # its sibling needs (measuring took 0.76 s instead of 0.1 s with spinning on a busy 2-core VM)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
        env["OMP_WAIT_POLICY"] = "passive"
        cmd = [str(build_probe(build_dir)), "1e-3", str(best_of), *map(str, sizes)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            data = json.loads(proc.stdout) if proc.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            raise PhysicsProbeFailed(f"the bandwidth probe {cmd[0]} failed: {e}") from e
        if data is None:
            raise PhysicsProbeFailed(
                f"the bandwidth probe {cmd[0]} exited {proc.returncode}: {proc.stderr.strip()}"
            )
        try:
            return cls.from_json({**data, "caches": caches})
        except ValueError as e:
            raise PhysicsProbeFailed(f"the bandwidth probe {cmd[0]} printed unusable figures: {e}") from e

    def _start(self, working_set_bytes: int) -> int:
        below = [i for i, s in enumerate(self.sizes) if s <= working_set_bytes]
        return below[-1] if below else 0

    def bytes_per_s(self, working_set_bytes: int, figure: str = "") -> float:
        """The bandwidth ceiling for data of this footprint: the best figure (`figure`: "read",
        "write" or "copy"; all three when not given) measured at any size from the largest measured
        size not above it upward (beyond the last size: the DRAM figure). Taking the grid point at or
        below, not above, matters: bandwidth only falls as the footprint grows, so a footprint between
        two grid points (say 20 MB, fitting a 32 MB L3) gets the faster neighbour's ceiling, an upper
        bound; the slower one (DRAM at 64 MB) would be a lower bound and would flag honest kernels."""
        start = self._start(working_set_bytes)
        figures = [getattr(self, figure)] if figure else [self.read, self.write, self.copy]
        return max(max(r[start:]) for r in figures) * 1e9

    def bounds(self, work: Work) -> list[tuple[float, str, float]]:
        """Per ceiling, the shortest time an honest call doing `work` can take here, the rate that
        sets it ("<what> at <rate>") and the margin allowed past it.

        Each is a lower bound on its own: every byte the call must read at no more than the read
        ceiling, every byte it must write at no more than the write ceiling, all of its traffic at no
        more than the best of the three figures, its declared FLOPs at no more than the FMA peak.
        Read and write ceilings are the larger of the pure stream (vector sum, memset) and half the
        copy figure: a call that reads while it writes can write faster than a pure memset (DRAM
        here: memcpy wrote 22 GB/s while memset reached 19), so the pure figure alone would flag an
        honest copy. A sum of read and write times would be no bound at all: memcpy moved 44 GB/s in
        all where reads alone reached 29 and writes 19."""
        ws = work.working_set
        half_copy = self.bytes_per_s(ws, "copy") / 2
        read, write = (
            max(self.bytes_per_s(ws, "read"), half_copy),
            max(self.bytes_per_s(ws, "write"), half_copy),
        )
        moved, best = work.read + work.written, self.bytes_per_s(ws)
        where = f"for a {_size(ws)} working set ({'its caches' if ws <= self.sizes[-1] // 4 else 'memory'})"
        margin = self.margin(ws)
        found = [
            (
                work.read / read,
                f"reading {_size(work.read)} at the {_rate(read)}B/s this machine reads {where}",
                margin,
            ),
            (
                work.written / write,
                f"writing {_size(work.written)} at the {_rate(write)}B/s it writes {where}",
                margin,
            ),
            (moved / best, f"moving {_size(moved)} at the {_rate(best)}B/s it moves data {where}", margin),
        ]
        if work.flops:
            flops = f"{work.flops / 1e9:.4g} GFLOP at this machine's {_rate(self.flops_per_s)}FLOP/s FMA peak"
            found.append(
                (
                    work.flops / self.flops_per_s,
                    f"doing {flops} (FLOPs beyond the peak)",
                    self.margin(flops=True),
                )
            )
        return found

    def bound(self, work: Work) -> float:
        """The shortest time an honest call doing `work` can take here (no margin)."""
        return max(b[0] for b in self.bounds(work))

    def margin(self, working_set: int = 0, flops: bool = False) -> float:
        """How far past a ceiling an honest call may seem to go: the probe's own spread at that
        footprint (or the FMA's), never under the floor.

        The floors were measured. Bandwidth (AMD EPYC VM, AVX-512, 2 cores shared with other jobs): 72
        honest kernels (numpy copyto/add/sum; OpenMP C triad, sum and non-temporal copy on huge and 4
        KiB pages; 16 KiB to 768 MiB), each timed best-of-20..200, reached at most 1.24x the lowest of 8
        probe runs' ceiling; DESIGN.md's DRAM regimes flip ~1.6x, and a ceiling merged over runs keeps
        the fast regime once seen, but a first run may have seen only the slow one: 1.24 x 1.6 = 2.
        FMA: an honest sgemm may do fewer FLOPs than the declared 2*M*N*K (Strassen, 7/8 a level:
        0.67x at three levels), and bf16/fp16 dot instructions run 2x the float32 FMA rate: 2.
        On the Xeon VM (AVX-512, 2 cores, loaded by other jobs) the sample operators' committed kernels
        and every tuned variant of the README main job (budget 8) reached at most 0.38 of their bound
        (sgemm's best: 101 of 267 GFLOP/s), the memory-bound ones 0.11-0.29; the probe's spread (best
        over median sample) was 1.01-1.06 at all sizes but the largest (1.5), 1.02-1.06 for the FMA.
        A cache that returns at once claims 100-10000x; one that skips two thirds of its reads, 3x."""
        if flops:
            return max(FLOPS_FLOOR, self.gflops_spread)
        return max((BANDWIDTH_FLOOR, *self.spread[self._start(working_set) :]))

    @property
    def flops_per_s(self) -> float:
        return self.gflops * 1e9

    def check(self, work: Work, seconds: float) -> str:
        """The empty string when a call doing `work` could have taken `seconds` here, within the
        margins; else one line saying why not: which ceiling, by how much."""
        if not seconds > 0:
            return f"timed {seconds!r} s for a call that moved {_size(work.read + work.written)}: no call takes no time"
        for shortest, what, margin in self.bounds(work):
            if shortest > margin * seconds:
                return (
                    f"took {_duration(seconds)}, {_times(shortest / seconds)}x faster than physics allows"
                    f" (x{margin:.3g} margin): {what} takes {_duration(shortest)}"
                )
        return ""

    def merged(self, other: Ceilings) -> Ceilings:
        """Per size and figure, the higher of two measurements (a ceiling only rises with evidence);
        per size, the lower known spread (the ceilings are the steadiest run's best, or better)."""
        figures: dict[int, list[float]] = {}
        for c in (self, other):
            for i, s in enumerate(c.sizes):
                old = figures.get(s, [0.0, 0.0, 0.0, 0.0])
                spread = c.spread[i] if c.spread else 0.0
                figures[s] = [max(a, b) for a, b in zip(old, (c.read[i], c.write[i], c.copy[i]))] + [
                    _steadier(old[3], spread)
                ]
        sizes = sorted(figures)
        spreads = tuple(figures[s][3] for s in sizes)
        return Ceilings(
            tuple(sizes),
            tuple(figures[s][0] for s in sizes),
            tuple(figures[s][1] for s in sizes),
            tuple(figures[s][2] for s in sizes),
            max(self.gflops, other.gflops),
            max(self.threads, other.threads),
            self.caches or other.caches,
            self.seconds,
            spreads if all(spreads) else (),
            _steadier(self.gflops_spread, other.gflops_spread),
        )

    def to_json(self) -> dict[str, Any]:
        """A plain dict (lists, numbers, strings) that json.dumps and from_json take back."""
        return {"version": FORMAT_VERSION, **json.loads(json.dumps(asdict(self)))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ceilings:
        """Rebuild from to_json() (or the probe's output); ValueError when it is not a usable one."""
        try:
            caps = cls(
                tuple(int(s) for s in data["sizes"]),
                tuple(float(x) for x in data["read"]),
                tuple(float(x) for x in data["write"]),
                tuple(float(x) for x in data["copy"]),
                float(data["gflops"]),
                int(data.get("threads", 0)),
                {str(k): int(v) for k, v in dict(data.get("caches", {})).items()},
                float(data.get("seconds", 0)),
                tuple(float(x) for x in data.get("spread", ())),  # none in a version-1 record
                float(data.get("gflops_spread", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a ceilings record: {e!r}") from e
        figures = (*caps.read, *caps.write, *caps.copy, caps.gflops)
        if not caps.sizes or any(len(f) != len(caps.sizes) for f in (caps.read, caps.write, caps.copy)):
            raise ValueError("not a ceilings record: no sizes, or figures that do not match them")
        if not all(math.isfinite(x) and x > 0 for x in figures):
            raise ValueError("not a ceilings record: a figure is not a positive number")
        spreads = (*caps.spread, caps.gflops_spread)
        if (caps.spread and len(caps.spread) != len(caps.sizes)) or not all(
            math.isfinite(x) and x >= 0 for x in spreads
        ):
            raise ValueError("not a ceilings record: spreads that do not match the sizes")
        return caps


def _steadier(a: float, b: float) -> float:
    """The lower of two spreads, 0 (not measured) only when both are."""
    return min(x for x in (a, b) if x > 0) if a > 0 or b > 0 else 0.0


class CeilingStore(Protocol):
    """Where ceilings persist per hardware fingerprint (the experience graph)."""

    def ceilings(self, hardware: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def save_ceilings(self, hardware: Mapping[str, Any], data: Mapping[str, Any]) -> None: ...


def ceilings_for(
    store: CeilingStore | None, hardware: Mapping[str, Any], build_dir: Path, refresh: bool = False
) -> Ceilings:
    """This hardware's stored ceilings, or measured now and saved. refresh=True measures again and
    keeps the higher figures (call it before rejecting on a ceiling that may have been measured on a
    loaded machine or in the slow DRAM regime)."""
    stored = None
    if store is not None and (record := store.ceilings(hardware)) is not None:
        try:
            stored = Ceilings.from_json(record)
        except ValueError:
            stored = None  # an old or damaged record: measure again
    if stored is not None and not refresh:
        return stored
    caps = Ceilings.measure(build_dir)
    caps = caps.merged(stored) if stored is not None else caps
    if store is not None:
        store.save_ceilings(hardware, caps.to_json())
    return caps
