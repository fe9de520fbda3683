"""Measure as a machine with a narrower instruction set would: AVX2 on an AVX-512 machine.

An `Isa` says what the timing process needs to behave like such a machine: compiler flags added after
every kernel's own (and the roof probe's), and environment variables for the peers' libraries, which
read them at load time (so they must be set before torch and numpy are imported, in the process that
times). Nothing is assumed to work: `wide_code` disassembles a built library and `peer_report` asks
each library what it chose, and the bench refuses to time when either disagrees with the ISA asked for.

    avx2: gcc `-mno-avx512f` (after -march=native it turns off AVX-512F and every extension that
          needs it); ATEN_CPU_CAPABILITY=avx2 (torch's kernels and torch.compile's generated code);
          NPY_DISABLE_CPU_FEATURES=<numpy's AVX-512 dispatch targets>; OPENBLAS_CORETYPE=Haswell;
          MKL_ENABLE_INSTRUCTIONS=AVX2 (torch's mm); ONEDNN_MAX_CPU_ISA=AVX2.
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Isa:
    """An instruction set to measure at: extra compiler flags, the peers' settings, what must not appear."""

    name: str
    cflags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    forbidden: str = ""  # a regex over `objdump -d` output that must not match a built library
    torch_capability: str = ""  # what torch.backends.cpu.get_cpu_capability() must report ("" any)


def _avx2() -> Isa:
    env = {
        "ATEN_CPU_CAPABILITY": "avx2",
        "OPENBLAS_CORETYPE": "Haswell",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    }
    wide = numpy_avx512_targets()
    if wide:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(wide)
    return Isa("avx2", ("-mno-avx512f",), env, r"%zmm|%k[0-7]\b", "AVX2")


ISAS = ("native", "avx2")


def isa(name: str) -> Isa:
    """The `Isa` called `name` (one of ISAS)."""
    if name == "native":
        return Isa("native")
    if name == "avx2":
        return _avx2()
    raise ValueError(f"unknown ISA {name!r}; choose one of {', '.join(ISAS)}")


def numpy_avx512_targets() -> list[str]:
    """The AVX-512 targets this numpy dispatches to (its own names, for NPY_DISABLE_CPU_FEATURES)."""
    umath = _umath()
    return [t for t in getattr(umath, "__cpu_dispatch__", []) if "AVX512" in t or t == "X86_V4"]


def _umath() -> Any:
    """numpy's C core, which says what it dispatches to (None when this numpy has no such module)."""
    try:
        return importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        return None


def missing_env(chosen: Isa, environ: dict[str, str]) -> dict[str, str]:
    """The settings `chosen` needs that `environ` lacks. A variable the user set to another value is
    an error: the bench does not override the user's environment."""
    clash = {k: (environ[k], v) for k, v in chosen.env.items() if k in environ and environ[k] != v}
    if clash:
        said = "; ".join(f"{k}={have!r} (needs {want!r})" for k, (have, want) in clash.items())
        raise ValueError(f"--isa {chosen.name} needs other values than the environment has: {said}")
    return {k: v for k, v in chosen.env.items() if k not in environ}


def wide_code(library: Path | str, chosen: Isa, limit: int = 3) -> list[str]:
    """Instructions in `library` that `chosen` forbids (empty when none, or nothing is forbidden)."""
    if not chosen.forbidden:
        return []
    objdump = shutil.which("objdump")
    if objdump is None:
        raise RuntimeError(f"objdump is not on PATH: cannot check that {library} has no AVX-512 code")
    text = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True, check=True).stdout
    pattern = re.compile(chosen.forbidden)
    return [line.strip() for line in text.splitlines() if pattern.search(line)][:limit]


def peer_report(chosen: Isa, torch: Any) -> tuple[dict[str, str], list[str]]:
    """What the peers' libraries chose in this process, and how that disagrees with `chosen`."""
    seen: dict[str, str] = {}
    wrong: list[str] = []
    if torch is not None:
        seen["torch"] = str(torch.backends.cpu.get_cpu_capability())
        if chosen.torch_capability and seen["torch"] != chosen.torch_capability:
            wrong.append(f"torch reports CPU capability {seen['torch']}, not {chosen.torch_capability}")
    umath = _umath()
    features = getattr(umath, "__cpu_features__", {})
    used = [t for t in getattr(umath, "__cpu_dispatch__", []) if features.get(t)]
    seen["numpy"] = " ".join(used) or "baseline only"
    if chosen.name == "avx2" and set(used) & set(numpy_avx512_targets()):
        wrong.append(f"numpy still dispatches to {seen['numpy']}")
    corename = _openblas_corename()
    if corename:
        seen["openblas"] = corename
        want = chosen.env.get("OPENBLAS_CORETYPE")
        if want and corename.lower() != want.lower():
            wrong.append(f"OpenBLAS runs its {corename} kernels, not {want}")
    return seen, wrong


def _openblas_corename() -> str:
    for lib in loaded_openblas():
        for name in ("openblas_get_corename", "scipy_openblas_get_corename64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return bytes(fn()).decode()
    return ""


def loaded_openblas() -> list[ctypes.CDLL]:
    """The OpenBLAS libraries numpy loaded (to set their threads and ask what kernels they chose)."""
    import numpy  # noqa: F401 - its BLAS is what is looked for

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        maps = ""
    paths = {line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower() and "/" in line}
    paths |= set(glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*")))
    libs = []
    for p in sorted({os.path.realpath(p) for p in paths}):
        try:
            libs.append(ctypes.CDLL(p))
        except OSError:
            continue
    return libs
