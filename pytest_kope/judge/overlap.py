"""Calls made to overlap: a kernel that keeps state shared between calls or threads (a static
scratch buffer, a cache) is right whenever nothing else runs beside it, so a lone call on a busy
machine never shows it. Used by the differential replay where the committed kernel itself gives its
answer when called from two threads at once; each pair is checked against lone calls in the child.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from ..toolchains.base import IN, OUT, SCALAR
from . import arrays
from .guards import GuardedFunction

RACE_ENTRIES = 4  # recorded calls that get pairs: the largest (longest calls overlap most surely)
RACE_PAIRS = 3  # pairs per such call, the first always, the rest while RACE_SECONDS lasts
RACE_CALLS = 64  # at most this many calls by one member of a pair
RACE_SECONDS = 0.05  # at most this long on pairs over one replay
RACE_TOL = 0.05  # norm-wise: a race's error is of order 1, a reduction's changed order far below this


def chosen(manifest: list[dict[str, Any]]) -> set[str]:
    """The keys of the RACE_ENTRIES largest recorded calls that may be replayed at once."""
    size = lambda e: sum(math.prod(shape) * np.dtype(d).itemsize for shape, d in e["inputs"].values())  # noqa: E731
    concurrent = sorted((e for e in manifest if e.get("concurrent")), key=size, reverse=True)
    return {e["key"] for e in concurrent[:RACE_ENTRIES]}


def _call(fn: Any, values: tuple[Any, ...]) -> list[str]:
    try:
        fn(*values)
    except Exception as e:  # a guard violation or the kernel's own error: named, and judged
        return [f"{type(e).__name__}: {str(e)[:300]}"]
    return []


def pairs_agree(
    fn: Any,
    values_of: Callable[[dict[int, np.ndarray]], tuple[Any, ...]],
    inputs: dict[int, np.ndarray],
    alone: tuple[Any, ...],
    written: list[int],
    pool: ThreadPoolExecutor,
    deadline: float,
) -> list[str]:
    """Pairs of calls that overlap must give what lone calls give (RACE_PAIRS). Two calls on the same
    data in step would write the same values into what they share and hide it, so the second takes
    the floating inputs halved."""
    halved = {i: x * x.dtype.type(0.5) if x.dtype.kind == "f" else x for i, x in inputs.items()}
    lone = [alone, values_of(halved)]
    errors = _call(fn, lone[1])
    for k in range(RACE_PAIRS):
        if errors or (k and time.monotonic() > deadline):
            return errors
        pair = [values_of(data) for data in (inputs, halved)]
        members = _overlapping(fn, deadline)
        found = pool.map(lambda m: _call(*m), zip(members, pair))
        errors = [e for member in found for e in member]
        for values, want in zip(pair, lone) if not errors else ():
            for i in written:
                got, lone_got = arrays.host(values[i]), arrays.host(want[i])
                why = (
                    arrays.mismatch(got, lone_got, RACE_TOL)
                    if got is not None and lone_got is not None
                    else ""
                )
                if why:  # state shared between calls or threads
                    return [f"called twice at once (pair {k + 1}): output #{i} differs from alone: {why}"]
    return errors


def _overlapping(fn: Any, deadline: float) -> list[Any]:
    """Two guarded copies of `fn` whose kernel calls overlap: thread start skew (0.3 ms on a VM) is
    longer than a small call, so each repeats its call on its own buffers until one began while the
    other was inside one, or the other is done; what is checked is the last call's output. A kernel
    with an in-place argument is called once (a repeat would compound)."""
    once = any(a.role not in (IN, OUT, SCALAR) for a in fn.function.args)
    inside, done = [False, False], [False, False]

    def member(me: int) -> GuardedFunction:
        def raw(*values: Any) -> Any:
            for _ in range(RACE_CALLS):
                overlapped, inside[me] = inside[1 - me], True
                try:
                    result = fn.function.raw(*values)
                finally:
                    inside[me] = False
                if once or overlapped or done[1 - me] or time.monotonic() > deadline:
                    break
            done[me] = True
            return result

        return GuardedFunction(replace(fn.function, raw=raw), fn.guards)

    return [member(0), member(1)]
