"""Calls made to overlap: a kernel that keeps state shared between calls or threads (a static
scratch buffer, a cache) is right whenever nothing else runs beside it, so a lone call on a busy
machine never shows it. Used by the differential replay where the committed kernel itself gives its
answer when called from two threads at once.

Two threads call the kernel over and over on their own buffers for a short window once both have
begun (thread start skew, 0.3 ms on a VM, is longer than a small call, and an OpenMP team's compute
is a few microseconds between waits), and every call's output is checked, in the child, against a
lone call's on the same inputs. Two calls on the same data in step would write the same values into
what they share and hide it, so the second thread takes the floating inputs halved.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import KernelDied, KernelTimeout
from ...toolchains.base import IN, OUT, SCALAR
from .. import arrays
from .guards import GuardedFunction

RACE_ENTRIES = 4  # recorded calls that get pairs: the largest of distinct shapes (longest overlap most)
RACE_PAIRS = 2  # pairs per such call, the first always, the second while RACE_SECONDS lasts
RACE_WINDOW = 0.005  # seconds both threads keep calling once both have begun
RACE_ALONE = 0.05  # seconds a thread keeps calling when the other has not begun
RACE_CALLS = 256  # at most this many calls by one thread of a pair
RACE_SECONDS = 0.05  # second pairs only within this long of the replay's start
RACE_TOL = 0.05  # norm-wise: a race's error is of order 1, a reduction's changed order far below this


def chosen(manifest: list[dict[str, Any]]) -> set[str]:
    """The keys of the RACE_ENTRIES largest recorded calls of distinct shapes that may run at once."""
    picked: dict[str, dict[str, Any]] = {}
    for e in manifest:
        shape = repr((e["function"], sorted(e["inputs"].items()), sorted(e["scalars"].items())))
        if e.get("concurrent") and shape not in picked:
            picked[shape] = e

    def size(e: dict[str, Any]) -> int:
        return sum(math.prod(shape) * np.dtype(d).itemsize for shape, d in e["inputs"].values())

    return {e["key"] for e in sorted(picked.values(), key=size, reverse=True)[:RACE_ENTRIES]}


def call_named(fn: GuardedFunction, values: tuple[Any, ...]) -> list[str]:
    """Call a guarded function; what went wrong, named in one line (none: an empty list). A kernel
    server that died or hung is raised on: a crash, not a wrong output (`differential.ReplayDied`)."""
    try:
        fn(*values)
    except (KernelDied, KernelTimeout):
        raise
    except Exception as e:  # a guard violation or the kernel's own error: named, and judged
        return [f"{type(e).__name__}: {str(e)[:300]}"]
    return []


def pairs_agree(
    fn: GuardedFunction,
    values_of: Callable[[dict[int, np.ndarray]], tuple[Any, ...]],
    inputs: dict[int, np.ndarray],
    alone: tuple[Any, ...],
    written: list[int],
    pool: ThreadPoolExecutor,
    deadline: float,
) -> list[str]:
    """Pairs of threads whose calls overlap must each get what a lone call gets (RACE_PAIRS)."""
    halved = {i: x * x.dtype.type(0.5) if x.dtype.kind == "f" else x for i, x in inputs.items()}
    lone = [alone, values_of(halved)]
    errors = call_named(fn, lone[1])
    wants = [{i: arrays.host_copy(values[i]) for i in written} for values in lone]
    for k in range(RACE_PAIRS):
        if errors or (k and time.monotonic() > deadline):
            return errors
        pair = [values_of(data) for data in (inputs, halved)]
        members, found = _overlapping(fn, wants, written)
        errors = [e for member in pool.map(lambda m: call_named(*m), zip(members, pair)) for e in member]
        if found and not errors:  # state shared between calls or threads
            return [f"called from two threads at once (pair {k + 1}): {found[0]}"]
    return errors


def _overlapping(fn: GuardedFunction, wants: list[dict[int, Any]], written: list[int]) -> tuple[list[Any], list[str]]:
    """Two guarded copies of `fn` that call the kernel over and over on their buffers until
    RACE_WINDOW after both began, checking each call's outputs against `wants` (what they say
    goes into the returned list). A kernel with an in-place argument is called once (a repeat
    would compound)."""
    once = any(a.role not in (IN, OUT, SCALAR) for a in fn.function.args)
    began: list[float] = []
    found: list[str] = []

    def member(me: int) -> GuardedFunction:
        def raw(*values: Any) -> Any:
            began.append(mine := time.monotonic())
            for n in range(1, RACE_CALLS + 1):
                result = fn.function.raw(*values)
                for i in written:
                    why = _differs(arrays.host(values[i]), wants[me][i])
                    if why:
                        found.append(
                            f"call {n} of thread {me + 1}, output #{i} differs from a lone call's: {why}"
                        )
                now = time.monotonic()
                both = len(began) == 2 and now - max(began) > RACE_WINDOW
                if once or found or both or now - mine > RACE_ALONE:
                    break
            return result

        return GuardedFunction(replace(fn.function, raw=raw), fn.guards, fn.run)

    return [member(0), member(1)], found


def _differs(got: np.ndarray | None, want: np.ndarray | None) -> str:
    """Why a call's output is not a lone call's; bitwise equality first, which most kernels give, so
    the thread is back in the kernel within microseconds (the threaded norm-wise compare took 0.1 ms
    a call and halved how often the two threads' kernels overlapped)."""
    if got is None or want is None or np.array_equal(got, want, equal_nan=got.dtype.kind in "fc"):
        return ""
    return arrays.mismatch(got, want, RACE_TOL)
