"""The CPU half of a hardware fingerprint: what every measurement on this machine belongs to."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

_SIMD = re.compile(r"^(sse\d?(_\d)?|ssse3|avx\w*|fma\d?|f16c|amx\w*|neon|asimd\w*|sve\w*)$")


@functools.lru_cache(maxsize=1)
def cpu_fingerprint() -> dict[str, Any]:
    model, flags = platform.processor() or "unknown", []
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "CPU part") and model in ("unknown", "", platform.machine()):
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = sorted(f for f in value.split() if _SIMD.match(f))
    return {
        "arch": platform.machine(),
        "model": model,
        "simd": flags,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    }


def fingerprint_id(fp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:12]


def describe(fp: dict[str, Any]) -> str:
    """A short human name: 'AMD EPYC (x86_64, avx512f, 2 cores)'."""
    simd = fp.get("simd") or []
    best = next((s for s in ("avx512f", "avx2", "avx", "sve", "asimd", "neon", "sse4_2") if s in simd), "")
    device = fp.get("device")
    parts = [fp.get("arch", "?")] + ([best] if best else []) + [f"{fp.get('cores', '?')} cores"]
    head = f"{device} on " if device else ""
    return f"{head}{fp.get('model', 'unknown')} ({', '.join(parts)})"
