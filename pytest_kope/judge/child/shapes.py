"""How each buffer of a kernel function is sized by its integer arguments, read off the recorded calls.

A rule is accepted only when it holds on every recorded call and no other rule does: a buffer's
dimensions each equal one integer argument (or a constant), or, for a flat buffer, its element
count is a constant times the product of a subset of the integer arguments that vary. Anything
less certain is no rule, and a function without one for every buffer gets no new sizes (drawing
sizes the kernel was never meant for would only judge the drawing).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

MAX_SUBSET = 3  # integer arguments one flat buffer's count may be the product of


@dataclass(frozen=True)
class Sized:
    """One recorded call, as far as sizes go: integer arguments and array shapes by argument index."""

    ints: dict[int, int]
    shapes: dict[int, tuple[int, ...]]


@dataclass(frozen=True)
class Rules:
    """Each buffer's shape as a function of the integer arguments (`shape`), and which vary."""

    dims: dict[int, tuple[tuple[str, int], ...]]  # buffer -> per dimension ("arg", index) | ("const", n)
    flat: dict[int, tuple[int, tuple[int, ...]]]  # flat buffer -> (constant, argument indices)
    varying: tuple[int, ...]  # integer arguments that differ between recorded calls

    def shape(self, ints: dict[int, int], buffer: int) -> tuple[int, ...]:
        """The shape of `buffer` for the integer arguments `ints`."""
        if buffer in self.dims:
            return tuple(ints[n] if kind == "arg" else n for kind, n in self.dims[buffer])
        constant, args = self.flat[buffer]
        return (constant * math.prod(ints[j] for j in args),)


def infer(calls: list[Sized]) -> Rules | str:
    """The rules every call obeys, or one line saying why there are none."""
    distinct = {tuple(sorted(c.ints.items())) for c in calls}
    if len(distinct) < 2:
        return "fewer than two recorded calls with different integer arguments"
    ints = sorted(calls[0].ints)
    varying = tuple(j for j in ints if len({c.ints[j] for c in calls}) > 1)
    if not varying:
        return "no integer argument varies between the recorded calls"
    dims: dict[int, tuple[tuple[str, int], ...]] = {}
    flat: dict[int, tuple[int, tuple[int, ...]]] = {}
    for buffer in sorted(calls[0].shapes):
        if len({len(c.shapes[buffer]) for c in calls}) > 1:
            return f"argument #{buffer} changes its number of dimensions between calls"
        per_dim = _dims(calls, buffer, varying)
        if per_dim is not None:
            dims[buffer] = per_dim
            continue
        if len(calls[0].shapes[buffer]) > 1:
            return f"argument #{buffer}: no integer argument gives each of its dimensions"
        product = _product(calls, buffer, varying)
        if isinstance(product, str):
            return f"argument #{buffer}: {product}"
        flat[buffer] = product
    used = {n for d in dims.values() for kind, n in d if kind == "arg"} | {
        j for _, args in flat.values() for j in args
    }
    if unsized := [j for j in varying if j not in used]:
        return f"integer argument #{unsized[0]} varies but sizes no buffer: how it relates to the sizes is unknown"
    return Rules(dims, flat, varying)


def _dims(calls: list[Sized], buffer: int, varying: tuple[int, ...]) -> tuple[tuple[str, int], ...] | None:
    """Each dimension as the one varying argument it always equals, or a constant; None when one
    dimension is neither, or could be either of two arguments."""
    out: list[tuple[str, int]] = []
    for d in range(len(calls[0].shapes[buffer])):
        sizes = [c.shapes[buffer][d] for c in calls]
        fits = [j for j in varying if all(c.ints[j] == s for c, s in zip(calls, sizes))]
        if len(fits) == 1:
            out.append(("arg", fits[0]))
        elif not fits and len(set(sizes)) == 1:
            out.append(("const", sizes[0]))
        else:
            return None
    return tuple(out)


def _product(calls: list[Sized], buffer: int, varying: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | str:
    """The one (constant, subset) with count = constant * product of the subset on every call."""
    counts = [math.prod(c.shapes[buffer]) for c in calls]
    fits = []
    for size in range(min(MAX_SUBSET, len(varying)) + 1):
        for subset in itertools.combinations(varying, size):
            products = [math.prod(c.ints[j] for j in subset) for c in calls]
            if any(p <= 0 or n % p for n, p in zip(counts, products)):
                continue
            constants = {n // p for n, p in zip(counts, products)}
            if len(constants) == 1 and (constant := constants.pop()) > 0:
                fits.append((constant, subset))
    if len(fits) != 1:
        return (
            "its element count is no single product of integer arguments"
            if not fits
            else (f"its element count fits {len(fits)} products of integer arguments")
        )
    return fits[0]
