"""The measuring core of `kope_bench`: warm-up, calibrated rounds, rotated buffers, paired rounds.

Free of pytest so the same code runs in a plain test, in a judging child and in a benchmark.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .stats import PairedRatio, Stats

Call = Callable[..., object]


@dataclass(frozen=True)
class Budget:
    warmup: int = 1  # calls before measuring (first-touch page faults, lazy binding, caches)
    min_round_s: float = 0.005  # calibrate calls per round so a round lasts at least this
    min_rounds: int = 5
    max_rounds: int = 50
    max_time_s: float = 1.0  # stop adding rounds after this much measuring


PLAIN = Budget()
PAIRED = Budget(min_rounds=7, max_rounds=41, max_time_s=3.0)


def last_level_cache_bytes() -> int:
    try:
        return int(os.sysconf("SC_LEVEL3_CACHE_SIZE")) or 32 << 20
    except (ValueError, OSError):
        return 32 << 20


def rotation(args: Sequence[object], max_copies: int = 8) -> list[tuple]:
    """Copies of the argument tuple, enough to overflow the last-level cache, cycled call to call.

    Repeated calls on one buffer would time cache hits, not the kernel. Every copy is allocated the
    same way, and candidate and reference share them, so neither gets luckier pages.
    """
    size = sum(getattr(a, "nbytes", 0) for a in args)
    copies = 1 if size == 0 else min(max_copies, max(1, math.ceil(2 * last_level_cache_bytes() / size)))
    sets = [tuple(args)]
    for _ in range(copies - 1):
        sets.append(tuple(copy.deepcopy(a) if hasattr(a, "nbytes") else a for a in args))
    return sets


def _run(fn: Call, sets: list[tuple], start: int, n: int, clock, sync) -> float:
    sync()
    t0 = clock()
    for i in range(n):
        fn(*sets[(start + i) % len(sets)])
    sync()
    return clock() - t0


def calibrate(fn: Call, sets: list[tuple], clock, sync, budget: Budget) -> int:
    """Calls per round so a round lasts at least `min_round_s` (pytest-benchmark's idea)."""
    for i in range(budget.warmup):
        fn(*sets[i % len(sets)])
    n = 1
    while True:
        took = _run(fn, sets, 0, n, clock, sync)
        if took >= budget.min_round_s or n >= 1 << 20:
            return n
        n = max(n * 2, math.ceil(n * budget.min_round_s / max(took, 1e-9)))


def measure(fn: Call, args: Sequence[object], clock, sync, budget: Budget = PLAIN) -> Stats:
    sets = rotation(args)
    n = calibrate(fn, sets, clock, sync, budget)
    per_call, spent, r = [], 0.0, 0
    while r < budget.max_rounds and (r < budget.min_rounds or spent < budget.max_time_s):
        took = _run(fn, sets, r * n, n, clock, sync)
        per_call.append(took / n)
        spent += took
        r += 1
    return Stats.of(per_call, n)


def measure_paired(
    reference: Call, candidate: Call, args: Sequence[object], clock, sync, budget: Budget = PAIRED
) -> tuple[Stats, Stats, PairedRatio]:
    """Interleaved rounds in one window (ABBA order), so drift and bandwidth regimes hit both alike."""
    sets = rotation(args)
    n_ref = calibrate(reference, sets, clock, sync, budget)
    n_cand = calibrate(candidate, sets, clock, sync, budget)
    ref, cand, spent, r = [], [], 0.0, 0
    while r < budget.max_rounds and (r < budget.min_rounds or spent < budget.max_time_s):
        order = [(reference, n_ref, ref), (candidate, n_cand, cand)]
        for fn, n, out in order if r % 2 == 0 else reversed(order):
            took = _run(fn, sets, r * n, n, clock, sync)
            out.append(took / n)
            spent += took
        r += 1
    return Stats.of(ref, n_ref), Stats.of(cand, n_cand), PairedRatio.of(ref, cand)
