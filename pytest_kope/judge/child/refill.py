"""Buffers reused as programs reuse them: the same buffers refilled in place between calls.

A training loop or a server calls a kernel again and again on the same buffers, rewriting their
contents in place: all of them, or a few elements (a mask, a token), or one. A kernel that keys a
cache of results on the buffer's address, or on a sample of its elements, is right on every call a
judge makes with fresh buffers and wrong on the second call of such a loop. So the differential
check makes that loop itself, on buffers the host holds, for every recorded function: a few of
its recorded calls (the largest of distinct shapes, `CALLS`) are replayed four times on the same
argument objects (so at the same places in the kernel server's arena too), the inputs rewritten in
place before each call: as tested, then every element (each times its own random factor, as fresh
timed inputs are), then `FEW` elements of each floating input, then one element of one input, each
set to the far end of its input's range. Every output must follow its inputs: the controller
compares each call's outputs with the committed kernel's on the same inputs, and a stale one names
the call ("refilled in place, call 3 of 4 ..."). Deterministic: the sequence is always made, so
whether a cache is caught no longer depends on two calls happening to share a buffer.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...toolchains.base import OUT, SCALAR, Arg
from .. import arrays
from ..measure import freshinputs

CALLS = 3  # recorded calls per function replayed as a loop on refilled buffers
MAX_BYTES = 4 << 20  # inputs of a call chosen for it, at most (its outputs are held four times)
FEW = 3  # elements refilled in each floating input at the third call
STEPS = 4  # calls on the same buffers: as tested, every element, a few, one


def chosen(calls: list[Any]) -> dict[int, int]:
    """The recorded calls (`recorder.Recorded`) replayed as a loop, by index, each with its rank in
    its function (0: the largest): per function the `CALLS` largest of distinct shapes that have a
    floating input and fit `MAX_BYTES`."""
    picked: dict[str, list[tuple[int, int]]] = {}
    shapes_seen: set[tuple[Any, ...]] = set()
    for index, call in enumerate(calls):
        size = sum(x.nbytes for x in call.inputs.values())
        shape = (call.function.name, *sorted((i, x.shape) for i, x in call.inputs.items()))
        if shape in shapes_seen or size > MAX_BYTES or not _floating(call.inputs):
            continue
        shapes_seen.add(shape)
        picked.setdefault(call.function.name, []).append((size, index))
    return {
        index: rank
        for found in picked.values()
        for rank, (_, index) in enumerate(sorted(found, reverse=True)[:CALLS])
    }


def _floating(inputs: dict[int, np.ndarray]) -> list[int]:
    return [i for i, x in sorted(inputs.items()) if x.dtype.kind == "f" and x.size]


def steps(inputs: dict[int, np.ndarray], which: int) -> Iterator[tuple[str, dict[int, np.ndarray]]]:
    """The inputs of each call of the loop, with what changed: as tested, every element refilled,
    `FEW` of each floating input, one element of one (the `which`-th floating input, cyclically)."""
    rng = np.random.default_rng(secrets.randbits(64))
    now = {i: x.copy() for i, x in inputs.items()}
    yield "as tested", {i: x.copy() for i, x in now.items()}
    floating = _floating(inputs)
    for i in floating:
        target = np.empty_like(now[i])
        freshinputs.fresh(target, now[i], secrets.randbits(64), freshinputs.Domain.of(now[i]))
        now[i] = target
    yield "every element refilled", {i: x.copy() for i, x in now.items()}
    for i in floating:
        _to_far_end(now[i], inputs[i], FEW, rng)
    yield f"{FEW} elements of each input refilled", {i: x.copy() for i, x in now.items()}
    one = floating[which % len(floating)]
    _to_far_end(now[one], inputs[one], 1, rng)
    yield f"one element of input #{one} refilled", {i: x.copy() for i, x in now.items()}


def _to_far_end(x: np.ndarray, domain_of: np.ndarray, count: int, rng: np.random.Generator) -> None:
    """Set `count` finite elements of `x` (in place) each to the end of the input's range farther
    from its value: the largest change the input's domain allows, so a stale output shows."""
    flat = x.reshape(-1)
    finite = np.flatnonzero(np.isfinite(flat))
    if not finite.size:
        return
    domain = freshinputs.Domain.of(domain_of)
    for p in rng.choice(finite, size=min(count, finite.size), replace=False):
        flat[p] = domain.hi if flat[p] - domain.lo < domain.hi - flat[p] else domain.lo


def entry_name(step: int, what: str) -> str:
    """How a replayed call of the loop is named in a failure."""
    return f"refilled in place (call {step + 1} of {STEPS} on the same buffers: {what})"


def refill_into(values: tuple[Any, ...], args: tuple[Arg, ...], inputs: dict[int, np.ndarray]) -> None:
    """Write a step's inputs into the loop's own argument objects, in place (outputs stay, to be
    poisoned by the guards before the call)."""
    for i, a in enumerate(args):
        if a.role not in (OUT, SCALAR) and i in inputs:
            arrays.assign(values[i], inputs[i])
