"""The judge's passes over large host buffers (fresh inputs, poison, parking, comparing, checksums), in C.

Each timed block of a perf test starts from fresh inputs and poisoned outputs, and one-call blocks are
checked in every round: per block, a pass over every input and output. In numpy those passes took
longer than the kernels they surround (a 64 MiB softmax: 21 ms of rescaling and poisoning and 28 ms
of parking and comparing around a 41 ms call), on one core. Here a pass over 4 MiB or more is split
over the cores this process may run on (plain pthreads, joined before returning: no pool is left
spinning beside a timed call), with ordinary stores, so the cache holds what numpy's passes left in
it; only a buffer larger than the last-level cache, which would not stay there anyway, is written
with SSE2 non-temporal stores, fenced before the timed window. The inputs' checksum (`digest`) is
keyed with weights drawn from the operating system once per process.

Copies, fills and comparisons are bit for bit numpy's; fresh inputs come from a counter-based
generator of their own (`fresh_into`; `freshinputs` has numpy's fallback, the same properties from
other random numbers). Without gcc, or for arrays that are not contiguous, numpy does it, as before;
off x86-64 the passes keep ordinary stores.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SOURCE = Path(__file__).with_name("memops.c")
FILL, COPY, CMP32, CMP64 = range(4)
# this machine's own instructions (the passes are built where they run, as candidates are)
FLAGS = ["-shared", "-fPIC", "-O3", "-march=native", "-pthread"]
KEY_WORDS = 4096  # the digest's weights: drawn from the operating system once per process
FLOATS = {np.dtype("float32"): CMP32, np.dtype("float64"): CMP64}
MIN_THREAD_BYTES = 4 << 20  # below this a thread costs more than it saves


@functools.lru_cache(maxsize=1)
def _lib() -> Any:
    """The compiled passes (once per process; a fork server's children inherit them), or None."""
    if shutil.which("gcc") is None:
        return None
    import cffi

    where = Path(tempfile.mkdtemp(prefix="kope-memops-"))
    try:
        subprocess.run(
            ["gcc", *FLAGS, str(SOURCE), "-o", "memops.so", "-lm"],
            cwd=where,
            check=True,
            capture_output=True,
            timeout=60,
        )
        ffi = cffi.FFI()
        ffi.cdef(
            "int kope_memop(int op, void *dst, const void *src, size_t n, size_t size, double f,"
            " uint64_t pat, int threads, int stream, double *out);"
            "uint64_t kope_digest(const void *words, size_t n, const uint64_t *key, int threads);"
            "int kope_fresh(void *dst, const void *src, size_t n, size_t size, uint64_t seed, double lo,"
            " double hi, int integral, int threads, int stream);"
        )
        return ffi, ffi.dlopen(str(where / "memops.so"))  # stays mapped once the file is gone
    except (OSError, subprocess.SubprocessError, cffi.CDefError):
        return None
    finally:
        shutil.rmtree(where, ignore_errors=True)


def available() -> bool:
    """Whether the compiled passes are there (else numpy does every pass)."""
    return _lib() is not None


@functools.lru_cache(maxsize=1)
def streaming_bytes() -> int:
    """Buffers at least this large are written past the cache: they would not stay in it anyway."""
    from .caches import last_level_cache_bytes

    return last_level_cache_bytes()


@functools.lru_cache(maxsize=1)
def _threads() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1))


def _plan(nbytes: int) -> tuple[int, bool] | None:
    """(threads, streamed) for a pass over `nbytes`, or None when numpy does as well (one thread,
    cached stores) or the passes are not there."""
    threads = _threads() if nbytes >= MIN_THREAD_BYTES else 1
    stream = nbytes >= streaming_bytes()
    return (threads, stream) if (threads > 1 or stream) and available() else None


def _run(
    op: int, dst: np.ndarray, src: np.ndarray | None, f: float = 0.0, pat: int = 0
) -> list[float] | None:
    """Run pass `op` over `dst` (and `src`): what it found (a comparison's maxima), or None when
    numpy should do it (see `_plan`)."""
    if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous for a in (dst, src) if a is not None):
        return None
    plan = _plan(dst.nbytes)
    if plan is None:
        return None
    ffi, lib = _lib()
    out = ffi.new("double[3]")
    source, target = (ffi.cast("void *", a.ctypes.data) for a in (dst if src is None else src, dst))
    lib.kope_memop(op, target, source, dst.size, dst.itemsize, f, pat, plan[0], int(plan[1]), out)
    return list(out)


def fresh_into(target: Any, pristine: Any, seed: int, lo: float, hi: float, integral: bool) -> bool:
    """target = fresh inputs drawn from `pristine` with `seed` (memops.c's FRESH says how: each
    element times its own factor; range, signs, zeros and integer values kept), for float32/64
    arrays of any size: numpy's fallback costs several passes and temporaries, this one pass (one
    thread below MIN_THREAD_BYTES). False: not done (the caller does it)."""
    if not isinstance(target, np.ndarray) or target.dtype not in FLOATS or not _same(target, pristine):
        return False
    if not (target.flags.c_contiguous and pristine.flags.c_contiguous and available()):
        return False
    ffi, lib = _lib()
    threads = _threads() if target.nbytes >= MIN_THREAD_BYTES else 1
    stream = int(target.nbytes >= streaming_bytes())
    dst, src = (ffi.cast("void *", a.ctypes.data) for a in (target, pristine))
    lib.kope_fresh(dst, src, target.size, target.itemsize, seed, lo, hi, int(integral), threads, stream)
    return True


def fill(target: Any, element: np.generic) -> bool:
    """Every element of `target` set to copies of the bits of `element` (whose size divides the
    target's); False: not done."""
    size = np.dtype(element.dtype).itemsize
    if not isinstance(target, np.ndarray) or size not in (1, 2, 4, 8) or target.itemsize % size:
        return False
    pattern = int(np.frombuffer(element.tobytes() * (8 // size), dtype=np.uint64)[0])
    return _run(FILL, target, None, pat=pattern) is not None


def copy_into(target: Any, source: Any) -> bool:
    """target[...] = source for arrays of one dtype and shape; False: not done."""
    return isinstance(target, np.ndarray) and _same(target, source) and _run(COPY, target, source) is not None


def compare(got: Any, want: Any) -> tuple[float, float] | None:
    """(largest |got - want|, largest |want|) in one threaded pass, when both are all finite floats
    of one dtype and shape; None otherwise (numpy looks closer)."""
    if not isinstance(got, np.ndarray) or got.dtype not in FLOATS or not _same(got, want):
        return None
    found = _run(FLOATS[got.dtype], got, want)
    if found is None or found[2]:
        return None
    return found[0], found[1]


def _same(a: np.ndarray, b: Any) -> bool:
    return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape


@functools.lru_cache(maxsize=1)
def _key() -> Any:
    ffi, _ = _lib()
    odd = np.frombuffer(secrets.token_bytes(8 * KEY_WORDS), dtype=np.uint64) | np.uint64(1)
    return ffi.new("uint64_t[]", [int(k) for k in odd])


def digest(data: np.ndarray) -> int | None:
    """A keyed checksum of a contiguous byte buffer's whole 64-bit words, threaded; None without
    the compiled passes. The key is drawn once per process (a fork server's children share the
    server's, drawn before any candidate ran), so no candidate can read from our source which
    change of its inputs keeps the checksum."""
    if not available() or not data.flags.c_contiguous:
        return None
    ffi, lib = _lib()
    words = data.nbytes // 8
    threads = _threads() if data.nbytes >= MIN_THREAD_BYTES else 1
    return int(lib.kope_digest(ffi.cast("void *", data.ctypes.data), words, _key(), threads))
