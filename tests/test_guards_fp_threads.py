"""The floating-point control state of every thread, not only the caller's: a kernel that leaves
flush-to-zero set in its OpenMP workers changes every later OpenMP kernel of the process."""

from __future__ import annotations

import faulthandler
import os
import platform
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.errors import GuardViolation
from pytest_kope.judge.child import fpstate, guards
from pytest_kope.judge.child.bench import Bench, BenchSession
from pytest_kope.spec import parse_spec
from pytest_kope.toolchains.base import Timer
from pytest_kope.toolchains.c import CToolchain

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="MXCSR is x86-64's")

TEAM = 4  # more threads than this machine's cores: a pool of workers besides the caller
FTZ_DAZ = 0x8040
# TRICK 0: honest. 1: FTZ/DAZ in the workers (never the caller) on every call. 2: from the third call
# on, so only unguarded (timed) calls leave it. `csrs` reports each team thread's MXCSR.
SOURCE = f"""\
// kope: kernel void scale(const float *x, float *y, int n)
// kope: kernel void csrs(int *out, int n)
// kope: param TRICK = 0 | 1 | 2
#include <omp.h>
#include <xmmintrin.h>
static int calls;
void scale(const float *x, float *y, int n) {{
    int trick = TRICK == 1 || (TRICK == 2 && ++calls > 2);
#pragma omp parallel num_threads({TEAM})
    {{
        if (trick && omp_get_thread_num() != 0) _mm_setcsr(_mm_getcsr() | {FTZ_DAZ});
#pragma omp for
        for (int i = 0; i < n; i++) y[i] = 2.0f * x[i];
    }}
}}
void csrs(int *out, int n) {{
#pragma omp parallel num_threads(n)
    out[omp_get_thread_num()] = (int)_mm_getcsr();
}}
"""


def build(tmp_path: Path, trick: int) -> guards.GuardedKernel:
    candidate = Candidate(SOURCE, "k.c", "c", {"TRICK": trick})
    return guards.GuardedKernel(CToolchain().build(candidate, parse_spec(SOURCE), tmp_path))


def workers_csr(kernel: guards.GuardedKernel) -> list[int]:
    """Each team thread's MXCSR, read by the kernel itself (unguarded: the guard would set it back)."""
    out = np.zeros(TEAM, dtype=np.int32)
    kernel.kernel.functions["csrs"].raw(out, TEAM)
    return [int(v) & 0xFFFF for v in out]


def args() -> tuple[np.ndarray, np.ndarray, int]:
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    return x, np.empty_like(x), x.size


def test_ftz_left_in_openmp_workers_is_a_violation_naming_the_thread_and_is_set_back(tmp_path: Path) -> None:
    cheat = build(tmp_path, 1)
    caller = fpstate.read()
    assert caller is not None and not caller & FTZ_DAZ
    cheat.kernel.functions["scale"].raw(*args())
    assert all(c & FTZ_DAZ == FTZ_DAZ for c in workers_csr(cheat)[1:]), "the trick did not take"
    with pytest.raises(GuardViolation) as caught:
        cheat.scale(*args())
    message = str(caught.value)
    assert re.search(
        r"floating-point control state changed in [1-9]\d* other thread\(s\): thread \d+ ", message
    )
    assert "flush-to-zero on, denormals-are-zero on" in message
    assert "left the floating-point control state changed (" not in message  # the caller was clean
    assert fpstate.read() == caller
    assert all(c & fpstate.CONTROL_MASK == caller & fpstate.CONTROL_MASK for c in workers_csr(cheat))


def test_an_honest_openmp_kernel_passes_every_call(tmp_path: Path) -> None:
    honest = build(tmp_path, 0)
    for _ in range(5):
        honest.scale(*args())
        honest.csrs(np.zeros(TEAM, dtype=np.int32), TEAM)


def test_guarded_calls_from_many_threads_at_once_check_each_other_cleanly(tmp_path: Path) -> None:
    honest = build(tmp_path, 0)  # as the differential replay calls kernels: each thread has its own pool

    def calls(_: int) -> None:
        for _ in range(50):
            honest.scale(*args())

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(calls, range(3)))


def test_ftz_left_in_workers_only_by_timed_calls_fails_the_timing(tmp_path: Path) -> None:
    cheat = build(tmp_path, 2)
    bench = Bench("t.py::test_perf", Timer(), BenchSession(), pytest.skip)
    with pytest.raises(
        GuardViolation, match=r"in timed calls, left the floating-point control state changed in"
    ):
        bench(cheat.scale, *args())
    caller = fpstate.read()
    assert caller is not None
    assert all(c & fpstate.CONTROL_MASK == caller & fpstate.CONTROL_MASK for c in workers_csr(cheat))


def test_a_thread_blocking_signals_is_waited_for_once_not_on_every_call() -> None:
    """The first sweep waits for it once and remembers it; later sweeps leave it out (ask no thread
    that cannot answer), so none of them waits for it again. Checked by what is remembered, not by
    the clock, which a loaded machine stretches."""
    before, helper = fpstate.current(), fpstate._helper()
    assert helper is not None
    threads = set(os.listdir("/proc/self/task"))
    faulthandler.dump_traceback_later(600)  # its watchdog thread blocks every signal
    try:
        (watchdog,) = (int(t) for t in set(os.listdir("/proc/self/task")) - threads)
        _until_it_blocks_signals(watchdog)  # a thread just started may not have blocked them yet
        for _ in range(3):  # found blocking by a sweep that waited for it (one, but for a rare race)
            assert fpstate.changes(before) == []
            if watchdog in helper.blocking:
                break
        assert watchdog in helper.blocking
        for _ in range(10):
            assert fpstate.changes(before) == []
            assert watchdog in helper.blocking
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_x87_control_word_of_the_caller_is_checked_and_set_back() -> None:
    before = fpstate.current()
    assert before is not None
    helper = fpstate._helper()
    assert helper is not None
    helper.lib.kope_setcw(before.cw & ~0x0300)  # single precision for x87 arithmetic
    assert fpstate.changes(before) == [
        f"left the floating-point control state changed (x87 control word {before.cw:#06x} -> "
        f"{before.cw & ~0x0300:#06x})"
    ]
    assert fpstate.current() == before


def _until_it_blocks_signals(tid: int, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/self/task/{tid}/status").read_text()
        blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        if int(blocked.split()[1], 16):
            return
        time.sleep(0.01)
    raise AssertionError(f"thread {tid} never blocked its signals")
