"""Process-wide state a kernel's timed calls leave changed (issue 35, item 4; issue 49).

A judged kernel runs in a kernel server of its own, so a setting it changes in its unguarded timed
calls (thread counts, flush-to-zero in its pool, torch's settings) can reach no other kernel; what it
leaves changed would reach the user's program, so each kernel's process is checked once its timing
ends, and a change ends the timing naming it. Here both kernels run in this process (as a plain run's
timing does): real timing, real libraries.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from test_forkserver import KERNEL, _candidate, _plan

from pytest_kope.errors import GuardViolation
from pytest_kope.judge.child import procstate
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.measure import timing
from pytest_kope.judge.outcome import Outcome


def _copy(x: np.ndarray, y: np.ndarray) -> None:
    np.copyto(y, x)


def _paired(candidate, snapshot: procstate.Snapshot):
    x, y = np.ones(1 << 14, np.float32), np.zeros(1 << 14, np.float32)

    def between(candidate_ran: bool) -> None:
        if found := snapshot.changes():
            raise GuardViolation(("candidate" if candidate_ran else "reference") + ": " + "; ".join(found))

    return timing.measure_paired(
        timing.KernelPair(_copy, candidate),
        timing.CallArgs((x, y), ["in", "out"]),
        timing.Clock(time.perf_counter, lambda: None),
        between=between,
    )


@pytest.mark.parametrize(
    "change,named",
    [
        (lambda: torch.set_num_threads(1), "torch threads"),
        (lambda: torch.set_default_dtype(torch.float64), "torch default dtype"),
        (lambda: torch.set_grad_enabled(False), "torch grad mode"),
        (lambda: np.seterr(all="ignore"), "numpy error handling"),
    ],
    ids=["threads", "dtype", "grad", "numpy"],
)
def test_a_setting_left_for_the_other_block_ends_the_timing_and_names_it(change, named):
    torch.set_num_threads(2)
    calls = []

    def candidate(x: np.ndarray, y: np.ndarray) -> None:
        np.copyto(y, x)
        calls.append(1)
        if len(calls) == 3:  # neither in its first calls nor at the end: between its blocks
            change()

    saved = (torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled(), np.geterr())
    try:
        with pytest.raises(GuardViolation, match=f"candidate: changed {named}"):
            _paired(candidate, procstate.Snapshot.take())
    finally:
        torch.set_num_threads(saved[0])
        torch.set_default_dtype(saved[1])
        torch.set_grad_enabled(saved[2])
        np.seterr(**saved[3])


def test_a_kernel_that_changes_nothing_is_timed():
    paired = _paired(_copy, procstate.Snapshot.take())
    assert paired.ratio.rounds >= 1 and not paired.mismatch


# Clears flush-to-zero in its OpenMP pool's threads at the start of each call and sets it at the end
# of every call at the perf test's size after its 10th there, hoping to pass the guarded calls and
# reach the timing's, where the reference's next block would run under it. (Counted over all calls,
# as it was, a count past the guarded calls' (the differential check alone makes over 160) was one
# that a timing on a loaded machine did not always reach: the kernel then never changed anything.)
POOL_FTZ = KERNEL.format(
    prelude="#include <xmmintrin.h>\nstatic int calls;",
    body="    int n_calls = n >= 65536 ? ++calls : 0;\n"
    "#pragma omp parallel num_threads(2)\n"
    "    _mm_setcsr(_mm_getcsr() & ~0x8040u);",
    after="    if (n_calls > 10) {\n"
    "#pragma omp parallel num_threads(2)\n"
    "        _mm_setcsr(_mm_getcsr() | 0x8040u);\n    }",
)


def test_a_c_kernel_leaving_flush_to_zero_in_its_pool_after_many_calls_is_never_timed_as_correct(tmp_path):
    plan = _plan(tmp_path)
    judge = Judge(plan, lambda c: [])
    try:
        base = judge.baseline(plan.operator.baseline())
        (judged,) = judge.correctness([_candidate(plan, POOL_FTZ)])
        if judged.outcome == Outcome.OK:  # its guarded calls were too few: the timing's checks see it
            judged = judge.performance(judged, base.candidate)
    finally:
        judge.close()
    assert judged.outcome == Outcome.INCORRECT, (judged.outcome, judged.failures)
    assert "flush-to-zero on" in judged.failures[0], judged.failures
