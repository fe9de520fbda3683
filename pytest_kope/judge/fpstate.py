"""Read and restore the x86 floating-point control register (MXCSR) around kernel calls.

A kernel built with -ffast-math may switch on flush-to-zero for the whole process, silently changing
every later result. Elsewhere than x86-64 (or without a compiler) the check is skipped.
"""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

CONTROL_MASK = 0xFFC0  # rounding, FTZ, DAZ and exception masks; not the sticky status flags
_SRC = "unsigned kope_getcsr(void){return __builtin_ia32_stmxcsr();}\nvoid kope_setcsr(unsigned v){__builtin_ia32_ldmxcsr(v);}\n"


@functools.lru_cache(maxsize=1)
def _lib() -> Any:
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    import cffi

    where = Path(tempfile.mkdtemp(prefix="kope-fp-"))
    (where / "fp.c").write_text(_SRC)
    try:
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "fp.c", "-o", "fp.so"],
            cwd=where,
            check=True,
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        shutil.rmtree(where, ignore_errors=True)
        return None
    ffi = cffi.FFI()
    ffi.cdef("unsigned kope_getcsr(void); void kope_setcsr(unsigned v);")
    lib = ffi.dlopen(str(where / "fp.so"))
    shutil.rmtree(where, ignore_errors=True)  # the library stays mapped
    return lib


def read() -> int | None:
    """The x86 MXCSR control bits, or None where they cannot be read."""
    lib = _lib()
    return int(lib.kope_getcsr()) if lib is not None else None


def write(value: int) -> None:
    """Set the x86 MXCSR register (restores what a kernel changed)."""
    lib = _lib()
    if lib is not None:
        lib.kope_setcsr(value)
