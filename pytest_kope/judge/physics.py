"""No time faster than physics: this machine's measured bandwidth and FMA ceilings, and the check.

A timed call that touched B bytes of a W-byte working set in t seconds cannot have moved B/t bytes per
second faster than this machine reaches for data of that footprint; a call doing F FLOPs cannot beat
the FMA peak. A kernel that "returns at once" from a cache breaks both by orders of magnitude.

    caps = ceilings_for(graph, fingerprint, kope_dir / "builds")   # measured once per hardware
    reason = caps.check(bytes_touched=2 * n * 4, working_set=2 * n * 4, seconds=t)
    if reason: ...  # the candidate's time is impossible: reject it with `reason`

The ceilings come from a small C probe (gcc -O3 -march=native -fopenmp), built once per compiler and
CPU into `build_dir/physics-<hash>/`: for working sets from 16 KiB to 4x the last-level cache it
takes the best-of-N read (vector sum, 8 accumulators), write (memset) and copy (memcpy) bandwidth of
all threads, on huge-page buffers (the faster case numpy gets), and the float32 FMA peak.
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

from ..errors import KopeError
from ..hardware import cpu_fingerprint
from ..toolchains.c import compiler_version
from .caches import cache_sizes, last_level_cache_bytes, llc_instances

SMALLEST = 16 << 10
FORMAT_VERSION = 1
DEFAULT_MARGIN = 4.0  # measured, not guessed: see Ceilings.check


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

    def bytes_per_s(self, working_set_bytes: int) -> float:
        """The bandwidth ceiling for data of this footprint: the best figure (read, write or copy)
        measured at any size from the largest measured size not above it upward (beyond the last
        size: the DRAM figure). Taking the grid point at or below, not above, matters: bandwidth only
        falls as the footprint grows, so a footprint between two grid points (say 20 MB, fitting a
        32 MB L3) gets the faster neighbour's ceiling, an upper bound; the slower one (DRAM at 64 MB)
        would be a lower bound and would flag honest kernels."""
        below = [i for i, s in enumerate(self.sizes) if s <= working_set_bytes]
        start = below[-1] if below else 0
        best = max(max(r[start:]) for r in (self.read, self.write, self.copy))
        return best * 1e9

    @property
    def flops_per_s(self) -> float:
        return self.gflops * 1e9

    def check(
        self,
        bytes_touched: int,
        working_set: int,
        seconds: float,
        flops: float | None = None,
        margin: float = DEFAULT_MARGIN,
    ) -> str:
        """The empty string when a call that touched `bytes_touched` bytes of a `working_set`-byte
        footprint (and did `flops` FLOPs) could have taken `seconds` here; else one line saying why not.

        The default margin (4) was measured (AMD EPYC VM, AVX-512, 2 cores shared with other jobs): 72
        honest kernels (numpy copyto/add/sum; OpenMP C triad, sum and non-temporal copy on huge and 4
        KiB pages; 16 KiB to 768 MiB), each timed best-of-20..200, reached at most 1.24x the lowest of 8
        probe runs' ceiling for their working set (the runs were taken under other jobs' load and beside
        a DRAM hog; their DRAM figures ranged 55-158 GB/s; the 1.24x was a 4 KiB-page NT copy of 64
        MiB). DESIGN.md's DRAM regimes flip ~1.6x, so an honest kernel may reach ~2x a ceiling stored in
        the slow regime: a margin of 2 sits on that edge, 4 leaves 2x headroom. A call that returns at
        once claims 100-10000x (128 MB in 13 us is 9846 GB/s against ~60), and 4 x 160 GB/s x 10 us
        still flags any instant return that skips more than ~6 MB.
        """
        if not seconds > 0:
            return (
                f"timed {seconds!r} s for a call that touched {_size(bytes_touched)}: no call takes no time"
            )
        rate, ceiling = bytes_touched / seconds, self.bytes_per_s(working_set)
        if rate > margin * ceiling:
            where = "caches reach" if working_set <= self.sizes[-1] // 4 else "memory reaches"
            return (
                f"moved {_size(bytes_touched)} in {_duration(seconds)} = {rate / 1e9:.0f} GB/s, beyond the"
                f" {ceiling / 1e9:.0f} GB/s this machine's {where} for a {_size(working_set)} working set"
                f" (x{margin:g} margin)"
            )
        if flops and flops / seconds > margin * self.flops_per_s:
            return (
                f"did {flops / 1e9:.4g} GFLOP in {_duration(seconds)} = {flops / seconds / 1e9:.0f} GFLOP/s,"
                f" beyond this machine's {self.gflops:.0f} GFLOP/s FMA peak (x{margin:g} margin)"
            )
        return ""

    def merged(self, other: Ceilings) -> Ceilings:
        """Per size and figure, the higher of two measurements (a ceiling only rises with evidence)."""
        figures: dict[int, list[float]] = {}
        for c in (self, other):
            for i, s in enumerate(c.sizes):
                old = figures.get(s, [0.0, 0.0, 0.0])
                figures[s] = [max(a, b) for a, b in zip(old, (c.read[i], c.write[i], c.copy[i]))]
        sizes = sorted(figures)
        return Ceilings(
            tuple(sizes),
            *(tuple(figures[s][k] for s in sizes) for k in range(3)),
            max(self.gflops, other.gflops),
            max(self.threads, other.threads),
            self.caches or other.caches,
            self.seconds,
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
                *(tuple(float(x) for x in data[k]) for k in ("read", "write", "copy")),
                float(data["gflops"]),
                int(data.get("threads", 0)),
                {str(k): int(v) for k, v in dict(data.get("caches", {})).items()},
                float(data.get("seconds", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a ceilings record: {e!r}") from e
        figures = (*caps.read, *caps.write, *caps.copy, caps.gflops)
        if not caps.sizes or any(len(f) != len(caps.sizes) for f in (caps.read, caps.write, caps.copy)):
            raise ValueError("not a ceilings record: no sizes, or figures that do not match them")
        if not all(math.isfinite(x) and x > 0 for x in figures):
            raise ValueError("not a ceilings record: a figure is not a positive number")
        return caps


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
