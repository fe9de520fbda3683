"""This machine's cache sizes: sysfs, then lscpu, then sysconf, then a generous guess.

Each source that yields nothing usable (no level-2 or larger data/unified cache) falls through to the
next, so a missing file or tool never leaves a silently wrong answer. The parsers are pure: tests feed
them recorded sysfs trees (`root`) and recorded lscpu output (text).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")
# When nothing says how big the caches are, assume big ones: the largest measured working set then
# surely spills to DRAM, and buffers rotated to overflow the last-level cache overflow any real one.
FALLBACK_CACHES = {"L1d": 64 << 10, "L2": 2 << 20, "L3": 256 << 20}
SYSCONF_NAMES = {
    "L1d": "SC_LEVEL1_DCACHE_SIZE",
    "L2": "SC_LEVEL2_CACHE_SIZE",
    "L3": "SC_LEVEL3_CACHE_SIZE",
    "L4": "SC_LEVEL4_CACHE_SIZE",
}


def _bytes(text: str) -> int:
    """'32K', '1024K', '32M', '1.5 MiB', '65536' -> bytes (0 when unreadable)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    return int(float(m[1]) * 1024 ** " KMGT".index(m[2].upper() or " ")) if m else 0


def _cache_name(level: int, kind: str) -> str | None:
    if kind == "Instruction":
        return None
    return "L1d" if level == 1 else f"L{level}"


def parse_sysfs(root: Path | str = SYSFS_CPU) -> dict[str, int]:
    """Data and unified caches of cpu0 from a sysfs tree (`root`/cpu0/cache/index*/level,type,size)."""
    found: dict[str, int] = {}
    for index in sorted(Path(root, "cpu0", "cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
            name = _cache_name(int(level), kind)
        except (OSError, ValueError):
            continue
        if name and _bytes(size):
            found[name] = max(found.get(name, 0), _bytes(size))
    return found


def parse_lscpu(text: str) -> dict[str, int]:
    """Per-instance cache sizes from `lscpu -B` or `lscpu` output, old ('L2 cache: 512K') or new
    ('L2: 1 MiB (2 instances)', '65536 (2 instances)': totals, divided by the instance count)."""
    found: dict[str, int] = {}
    pattern = r"^\s*L(\d)([di]?)(?: cache)?:\s*([\d.]+\s*[KMGT]?(?:i?B)?)\s*(?:\((\d+) instances?\))?\s*$"
    for m in re.finditer(pattern, text, re.MULTILINE | re.IGNORECASE):
        name = _cache_name(int(m[1]), "Instruction" if m[2].lower() == "i" else "Data")
        if name:
            found[name] = _bytes(m[3]) // int(m[4] or 1)
    return found


def parse_sysconf(values: Mapping[str, int]) -> dict[str, int]:
    """Cache sizes from `os.sysconf` values by name (SC_LEVEL1_DCACHE_SIZE ...); 0 or -1 = unknown."""
    return {k: int(values[n]) for k, n in SYSCONF_NAMES.items() if int(values.get(n) or 0) > 0}


def _run_lscpu() -> str:
    for cmd in (["lscpu", "-B"], ["lscpu"]):
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=10, env={**os.environ, "LC_ALL": "C"}
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        if proc.returncode == 0:
            return proc.stdout
    return ""


def _sysconf() -> dict[str, int]:
    values = {}
    for name in SYSCONF_NAMES.values():
        try:
            values[name] = os.sysconf(name)
        except (ValueError, OSError):
            pass  # a name this libc does not know
    return values


def cache_sizes(
    root: Path | str = SYSFS_CPU, lscpu: str | None = None, sysconf: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Per-instance data/unified cache sizes in bytes ({"L1d", "L2", "L3"} as present), from the first
    source that names a level-2 or larger cache: sysfs under `root`, then `lscpu` output (None: run
    it here; "": none), then sysconf values (None: this process's), then FALLBACK_CACHES."""
    sources: tuple[Callable[[], dict[str, int]], ...] = (
        lambda: parse_sysfs(root),
        lambda: parse_lscpu(_run_lscpu() if lscpu is None else lscpu),
        lambda: parse_sysconf(_sysconf() if sysconf is None else sysconf),
    )
    for source in sources:
        found = {k: v for k, v in source().items() if 1 << 10 <= v <= 64 << 30}
        if any(k != "L1d" for k in found):
            return found
    return dict(FALLBACK_CACHES)


def last_level_cache_bytes(caches: Mapping[str, int] | None = None) -> int:
    """The largest data or unified cache (of `caches`, or of this machine)."""
    return max((caches if caches is not None else cache_sizes()).values())


def llc_instances(root: Path = SYSFS_CPU) -> int:
    """How many last-level caches this process's CPUs spread over (1 when sysfs does not say)."""
    indexes = sorted(Path(root, "cpu0", "cache").glob("index*"), key=lambda p: _bytes(_read(p / "size")))
    cpus = 0
    for part in _read(indexes[-1] / "shared_cpu_list").split(",") if indexes else []:
        lo, _, hi = part.partition("-")
        cpus += int(hi or lo) - int(lo) + 1 if lo.strip().isdigit() else 0
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, math.ceil(mine / cpus)) if cpus else 1


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
