"""The CPU half of a hardware fingerprint: what every measurement on this machine belongs to.

A fingerprint names the machine: arch, CPU model, SIMD flags and the SIMD level they add up to
(`avx512`, `avx2`, ... on x86; `sve2`, `sve`, `neon` on ARM), the cores this process may use and the
cache sizes. Its identity (`fingerprint_id`, the graph's hardware key) hashes only the facts that
name the machine: keys derived from others (`simd_level`) or read from sources that may differ
between runs on the same machine (`caches`: sysfs, else lscpu, else sysconf) are left out, and
measured figures (bandwidth) never enter a fingerprint at all; they join the label (`label`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_SIMD = re.compile(r"^(sse\d?(_\d)?|ssse3|avx\w*|fma\d?|f16c|amx\w*|neon|asimd\w*|sve\w*)$")

# The best level whose flag is present names the machine's SIMD: flags as Linux spells them in
# /proc/cpuinfo (x86 `flags`, ARM `Features`; `pni` is SSE3, `asimd` is NEON on AArch64).
SIMD_LEVELS = (
    ("avx512", "avx512f"),
    ("avx2", "avx2"),
    ("avx", "avx"),
    ("sse4_2", "sse4_2"),
    ("sse4_1", "sse4_1"),
    ("ssse3", "ssse3"),
    ("sse3", "pni"),
    ("sse2", "sse2"),
    ("sve2", "sve2"),
    ("sve", "sve"),
    ("neon", "asimd"),
    ("neon", "neon"),
)

# Keys of a fingerprint that do not take part in its identity (see the module docstring).
DESCRIPTIVE_KEYS = frozenset({"simd_level", "caches"})

# ARM's own cores, by `CPU part` (implementer 0x41), and a few others: /proc/cpuinfo on AArch64 has
# no model name.
ARM_PARTS = {
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd05"): "Cortex-A55",
    ("0x41", "0xd07"): "Cortex-A57",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0xc0", "0xac3"): "AmpereOne",
}


def simd_level(flags: Iterable[str]) -> str:
    """The best SIMD level the flags name: 'avx512', 'avx2', ..., 'sve', 'neon'; '' when none."""
    present = set(flags)
    return next((level for level, flag in SIMD_LEVELS if flag in present), "")


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model, SIMD flags and level from /proc/cpuinfo text (the first processor's entries)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and key not in fields:
            fields[key] = value.strip()
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    model = fields.get("model name") or fields.get("Model") or fields.get("Hardware") or ""
    if not model and "CPU part" in fields:
        implementer, part = fields.get("CPU implementer", "").lower(), fields["CPU part"].lower()
        model = ARM_PARTS.get((implementer, part), f"ARM implementer {implementer} part {part}")
    return {
        "model": model,
        "simd": sorted({f for f in flags if _SIMD.match(f)}),
        "simd_level": simd_level(flags),
    }


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _read_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def make_fingerprint(
    cpuinfo: str, arch: str, cores: int, caches: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """A CPU fingerprint from its parts (tests feed recorded /proc/cpuinfo samples)."""
    parsed = parse_cpuinfo(cpuinfo)
    fp: dict[str, Any] = {
        "arch": arch,
        "model": parsed["model"] or platform.processor() or "unknown",
        "simd": parsed["simd"],
        "simd_level": parsed["simd_level"],
        "cores": cores,
    }
    if caches:
        fp["caches"] = {k: int(v) for k, v in sorted(caches.items())}
    return fp


@functools.lru_cache(maxsize=1)
def cpu_fingerprint() -> dict[str, Any]:
    """This machine's CPU fingerprint (read once per process)."""
    from .judge.measure.caches import FALLBACK_CACHES, cache_sizes

    caches = cache_sizes()
    return make_fingerprint(
        _read_cpuinfo(), platform.machine(), _cores(), None if caches == FALLBACK_CACHES else caches
    )


def identity(fp: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a fingerprint that names the machine: what its id hashes."""
    return {k: v for k, v in fp.items() if k not in DESCRIPTIVE_KEYS}


def fingerprint_id(fp: Mapping[str, Any]) -> str:
    """A short content hash of the fingerprint's identity (the graph's hardware key)."""
    text = json.dumps(identity(fp), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def level_of(fp: Mapping[str, Any]) -> str:
    """The fingerprint's SIMD level, derived from its flags when it does not say (older records)."""
    return str(fp.get("simd_level") or simd_level(fp.get("simd") or []))


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} B"


def describe(fp: Mapping[str, Any]) -> str:
    """A short human name for commit subjects and trailers: 'AMD EPYC (x86_64, avx512, 2 cores)'."""
    level = level_of(fp)
    device = fp.get("device")
    parts = [str(fp.get("arch", "?"))] + ([level] if level else []) + [f"{fp.get('cores', '?')} cores"]
    if fp.get("target_flags"):  # kernels built for a narrower machine than this one (kope_c_target_flags)
        parts.append(f"built with {fp['target_flags']}")
    head = f"{device} on " if device else ""
    return f"{head}{fp.get('model', 'unknown')} ({', '.join(parts)})"


def memory_bandwidth(ceilings: Mapping[str, Any] | None) -> float | None:
    """The measured read bandwidth (bytes/s) at the largest working set (main memory), if known, from
    the graph's ceilings record of this hardware (judge/measure/physics.py: figures in GB/s)."""
    try:
        sizes, read = list(ceilings["sizes"]), list(ceilings["read"])  # type: ignore[index]
        return float(read[sizes.index(max(sizes))]) * 1e9
    except (TypeError, KeyError, ValueError, IndexError):
        return None


def label(fp: Mapping[str, Any], ceilings: Mapping[str, Any] | None = None) -> str:
    """The full human name for reports: SIMD level, cores, caches and, when measured, memory bandwidth:
    'AMD EPYC (x86_64, avx512, 2 cores, L2 1 MiB, L3 32 MiB, 11.6 GB/s memory)'."""
    head = describe(fp)[:-1]
    caches = fp.get("caches") or {}
    extra = [f"{name} {_size(int(caches[name]))}" for name in ("L2", "L3", "L4") if caches.get(name)]
    bandwidth = memory_bandwidth(ceilings)
    if bandwidth:
        extra.append(f"{bandwidth / 1e9:.1f} GB/s memory")
    return head + "".join(f", {e}" for e in extra) + ")"
