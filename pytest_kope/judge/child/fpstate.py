"""Read and restore the x86 floating-point control state around kernel calls, in every thread.

A kernel built with -ffast-math may switch on flush-to-zero for the whole process, silently changing
every later result; a kernel may also leave it set only in the threads it ran on (its OpenMP pool),
where every later OpenMP kernel of the process (the other kernel of a paired timing) computes with it.
The control state is MXCSR's control bits (rounding, FTZ, DAZ, exception masks) and the x87 control
word (rounding, precision, exception masks); the sticky status flags are not part of it.

The caller's thread is read directly. Every other thread is sent a signal whose handler reads its
state and sets it back (`fpstate.c`), so what is covered does not depend on how a thread was made:
OpenMP pools of any runtime (nested teams' pools too), a kernel's own pthreads; every thread is
held to the caller's state, as every thread the process starts inherits its creator's. Threads that
block the signal are not covered: a kernel cannot block signals (the library screen admits no signal
calls and no system-call instructions), while Python's faulthandler watchdog does. A thread that
neither blocks the signal nor answers it is reported unchecked, never passed. The signal interrupts
threads (SA_RESTART: most blocking calls resume) only on guarded calls, never in a timed window.
Elsewhere than Linux on x86-64 (or without a compiler) the check is skipped.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTROL_MASK = 0xFFC0  # MXCSR: rounding, FTZ, DAZ and exception masks; not the sticky status flags
X87_MASK = 0x0F3F  # x87 control word: rounding, precision and exception masks
SOURCE = Path(__file__).with_name("fpstate.c")
FIRST_WAIT_S = 0.05  # then threads that have not answered are looked at (signal blocked? ended?)
ANSWER_S = 10.0  # a live thread that answers no signal in this long is reported unchecked (a loaded
# 2-core machine left a worker unscheduled past 2 s)
_ONE_AT_A_TIME = threading.Lock()  # the helper holds one sweep (kernels are called from many threads at once)
_CSR_BITS = {0x8000: "flush-to-zero", 0x0040: "denormals-are-zero"}
_CDEF = """
unsigned kope_getcsr(void); void kope_setcsr(unsigned v);
unsigned kope_getcw(void); void kope_setcw(unsigned v);
int kope_fp_install(int sig);
int kope_fp_ask(int sig, const int *ask, int n, unsigned csr, unsigned cw, int *gone);
int kope_fp_wait(const int *gone, double timeout_s, int *state, unsigned *csr, unsigned *cw);
void kope_fp_done(void);
"""


@dataclass(frozen=True)
class State:
    """One thread's floating-point control state: MXCSR and the x87 control word."""

    csr: int
    cw: int

    def differs(self, other: State) -> bool:
        """Whether a control bit differs (status flags are ignored)."""
        return bool((self.csr ^ other.csr) & CONTROL_MASK or (self.cw ^ other.cw) & X87_MASK)

    def change_to(self, now: State) -> str:
        """What changed from this state to `now`, in words."""
        parts = []
        if (self.csr ^ now.csr) & CONTROL_MASK:
            words = [
                f"{name} {'on' if now.csr & bit else 'off'}"
                for bit, name in _CSR_BITS.items()
                if (self.csr ^ now.csr) & bit
            ]
            parts.append(
                f"MXCSR {self.csr:#06x} -> {now.csr:#06x}" + (f" ({', '.join(words)})" if words else "")
            )
        if (self.cw ^ now.cw) & X87_MASK:
            parts.append(f"x87 control word {self.cw:#06x} -> {now.cw:#06x}")
        return ", ".join(parts)


@dataclass(frozen=True)
class _Helper:
    ffi: Any
    lib: Any
    signal: int
    blocking: set[int] = field(default_factory=set)  # threads that blocked the signal when last asked


HELPER_ENV = "KOPE_FP_HELPER"  # a helper library compiled by another process (a kernel server's host)


def use_helper(path: str) -> None:
    """Load the helper from `path` (compiled by `helper_library` elsewhere) instead of compiling one:
    a kernel server has no compiler in its jail."""
    os.environ[HELPER_ENV] = path
    _helper.cache_clear()


@functools.lru_cache(maxsize=1)
def helper_library() -> Path | None:
    """The helper compiled once for this machine and user (a stable path a jail can bind), or None."""
    if platform.system() != "Linux" or platform.machine() != "x86_64" or shutil.which("gcc") is None:
        return None
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"kope-fpstate-{os.getuid()}-{digest}"
    lib = folder / "fp.so"
    if lib.is_file() and not lib.is_symlink() and lib.stat().st_uid == os.getuid():
        return lib
    folder.mkdir(mode=0o755, exist_ok=True)
    if folder.is_symlink() or folder.stat().st_uid != os.getuid():
        return None  # another user's folder (or a planted link): never load what it holds
    tmp = folder / f".fp-{os.getpid()}.so"
    try:
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", str(SOURCE), "-o", str(tmp)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        os.replace(tmp, lib)
    except (OSError, subprocess.SubprocessError):
        return None
    return lib


@functools.lru_cache(maxsize=1)
def _helper() -> _Helper | None:
    """The compiled helper, with the signal it uses."""
    import cffi

    lib_path = os.environ.get(HELPER_ENV) or helper_library()
    if lib_path is None:
        return None
    try:
        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        lib = ffi.dlopen(str(lib_path))
    except (OSError, cffi.CDefError):
        return None
    # a real-time signal nothing else handles (Python and glibc leave the upper ones alone)
    sig = next((s for s in range(signal.SIGRTMAX, signal.SIGRTMIN, -1) if lib.kope_fp_install(s) == 0), 0)
    return _Helper(ffi, lib, sig)


def read() -> int | None:
    """The x86 MXCSR register of this thread, or None where it cannot be read."""
    h = _helper()
    return int(h.lib.kope_getcsr()) if h is not None else None


def write(value: int) -> None:
    """Set the x86 MXCSR register of this thread (restores what a kernel changed)."""
    h = _helper()
    if h is not None:
        h.lib.kope_setcsr(value)


def current() -> State | None:
    """This thread's control state, or None where it cannot be read."""
    h = _helper()
    return State(int(h.lib.kope_getcsr()), int(h.lib.kope_getcw())) if h is not None else None


def changes(before: State | None) -> list[str]:
    """What differs from `before`, in this thread and in every other thread of the process, each
    named; every one is set back to `before`'s control bits."""
    h = _helper()
    if h is None or before is None:
        return []
    now = State(int(h.lib.kope_getcsr()), int(h.lib.kope_getcw()))
    found = []
    if before.differs(now):
        h.lib.kope_setcsr((now.csr & ~CONTROL_MASK) | (before.csr & CONTROL_MASK))
        h.lib.kope_setcw((now.cw & ~X87_MASK) | (before.cw & X87_MASK))
        found.append(f"left the floating-point control state changed ({before.change_to(now)})")
    others = _other_threads(h, before)
    if others:
        shown = "; ".join(others[:3]) + (f"; and {len(others) - 3} more" if len(others) > 3 else "")
        found.append(
            f"left the floating-point control state changed in {len(others)} other thread(s): {shown}"
        )
    return found


def _other_threads(h: _Helper, want: State) -> list[str]:
    """Ask every thread but this one for its state; each line names a thread whose state differed
    from `want` (now set back) or could not be checked."""
    if not h.signal:
        return []
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []
    me = threading.get_native_id()
    with _ONE_AT_A_TIME:
        # a thread seen blocking the signal is not asked while it still does (each ask would wait)
        h.blocking.intersection_update([t for t in h.blocking if t in tids and _cannot_answer(t, h.signal)])
        tids = [t for t in tids if t != me and t not in h.blocking]
        if not tids:
            return []
        n, ffi = len(tids), h.ffi
        gone, state = ffi.new("int[]", n), ffi.new("int[]", n)
        csr, cw = ffi.new("unsigned[]", n), ffi.new("unsigned[]", n)
        n = h.lib.kope_fp_ask(h.signal, tids, n, want.csr, want.cw, gone)
        try:
            if h.lib.kope_fp_wait(gone, FIRST_WAIT_S, state, csr, cw):
                for i in range(n):
                    if not (gone[i] or state[i]) and _cannot_answer(tids[i], h.signal):
                        gone[i] = -1
                        h.blocking.add(tids[i])
                h.lib.kope_fp_wait(gone, ANSWER_S, state, csr, cw)
        finally:
            h.lib.kope_fp_done()
    found = []
    for i in range(n):
        if not (gone[i] or state[i]) and not _cannot_answer(tids[i], h.signal):  # ended meanwhile: gone
            found.append(
                f"{_name(tids[i])} did not answer in {ANSWER_S:g} s: its floating-point control state "
                "could not be checked"
            )
        elif state[i] == 1 and (seen := State(int(csr[i]), int(cw[i]))).differs(want):
            found.append(f"{_name(tids[i])}: {want.change_to(seen)}")
    return found


def _cannot_answer(tid: int, sig: int) -> bool:
    """Whether thread `tid` has ended or blocks signal `sig`."""
    try:
        status = Path(f"/proc/self/task/{tid}/status").read_text()
    except OSError:
        return True
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    blocked = int(fields.get("SigBlk", "0").strip() or "0", 16)
    return fields.get("State", "").strip()[:1] in ("Z", "X") or bool(blocked >> (sig - 1) & 1)


def _name(tid: int) -> str:
    try:
        comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    except OSError:
        comm = "ended"
    return f"thread {tid} ({comm!r})"
