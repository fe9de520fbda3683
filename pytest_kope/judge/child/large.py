"""Two calls larger than any drawn one: sizes beyond `draws.MAX_ELEMENTS`, on a budget.

Drawn calls stay small so that about 150 of them cost a tenth of a second; a kernel that takes a
cheaper path only above some size (a GELU approximated between 2^18 and 2^26 elements, a blocked
path for large batches) is right on every one of them. So after the drawing, the committed kernel's
recording child makes two calls whose largest buffer holds about 2^19 and 2^21 elements (`TARGETS`,
one step more), grown from the tests' largest call by doubling its smallest size argument
(a batch of 256 rows grows to 1025: sizes beyond every test's), values of the recorded magnitude. Before each, its time is predicted
from the last call's, growing as elements^`GROWTH` (a matrix product's time grows so with its
matrices' size); a call predicted over `BUDGET_S` is not made, and none after it. Candidates replay
them and the controller compares, as for every drawn call; they are not shrunk.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

import numpy as np

from ...toolchains.base import KernelFunction
from . import noise, structure
from .draws import Drawn, Plan, call_arguments, drawn_values, row_length, with_inputs, written_outputs

TARGETS = (
    1 << 19,
    1 << 21,
)  # elements of the largest buffer, about (each replay moves 8 MiB a buffer at most)
BUDGET_S = 0.15  # the committed kernel's predicted time for one large call, at most
GROWTH = 1.5  # a call's time grows at most as its elements to this power
TEST = "no test (a large call)"


def calls(
    p: Plan, fn: KernelFunction, recorded: list[dict[int, Any]]
) -> list[tuple[Drawn, dict[int, np.ndarray]]]:
    """The large calls of `fn` (the committed kernel), each with its outputs, grown from the largest
    of the `recorded` calls' scalar arguments; none where no size argument varies or the budget
    allows none."""
    if not p.sizes or not recorded:
        return []
    rng = np.random.default_rng(secrets.randbits(64))
    base = max(recorded, key=lambda scalars: _elements(p, scalars))
    last_n, last_s = _elements(p, base), _timed(p, fn, _drawn(p, base, rng))[1]
    made: list[tuple[Drawn, dict[int, np.ndarray]]] = []
    for target in TARGETS:
        scalars = _grown(p, base, target)
        n = _elements(p, scalars)
        if n <= last_n or last_s * (n / last_n) ** GROWTH > BUDGET_S:
            break
        drawn = _drawn(p, scalars, rng)
        outputs, last_s = _timed(p, fn, drawn)
        last_n = n
        if outputs is None:
            continue  # the committed kernel itself breaks here: nothing to hold a candidate to
        own = noise.own_error(with_inputs(p, fn, drawn), drawn.inputs, outputs)
        if own is None:
            continue  # the committed kernel itself breaks here: nothing to hold a candidate to
        drawn.own_error = own
        made.append((drawn, outputs))
    return made


def _elements(p: Plan, scalars: dict[int, Any]) -> int:
    """Elements of the call's largest buffer."""
    rules = p.rules
    return max(math.prod(rules.shape(scalars, i)) for i in (*p.dims, *p.flat))


def _grown(p: Plan, scalars: dict[int, Any], target: int) -> dict[int, Any]:
    """`scalars` with the smallest size argument doubled until the largest buffer holds `target`
    elements, then one step more on it (no power of two)."""
    grown = dict(scalars)
    smallest = min(p.sizes, key=lambda j: grown[j] // p.sizes[j][0])
    for _ in range(64):
        if _elements(p, grown) >= target:
            break
        smallest = min(p.sizes, key=lambda j: grown[j] // p.sizes[j][0])
        grown[smallest] *= 2
    grown[smallest] += p.sizes[smallest][0]
    return grown


def _drawn(p: Plan, scalars: dict[int, Any], rng: np.random.Generator) -> Drawn:
    """A call of these sizes with values of each input's recorded magnitude, mixed signs where its
    domain has them."""
    inputs = {}
    for i, b in p.buffers.items():
        centre = math.log10(max(abs(b.low), abs(b.high), 1e-30)) - 0.5
        look = {
            "centre": centre, "spread": 0.5, "ramp": False, "zeros": False, "specials": [],
            "signs": "mixed" if b.domain == "any" else "positive", "structure": structure.NONE,
        }  # fmt: skip
        inputs[i] = drawn_values(rng, b, p.rules.shape(scalars, i), look, row_length(p, scalars, i))
    summary = ", ".join(f"#{j}={scalars[j]}" for j in p.sizes)
    summary += "".join(f"; input #{i}: {x.size} values of the recorded magnitude" for i, x in inputs.items())
    peak = max((float(np.abs(x[np.isfinite(x)]).max(initial=0.0)) for x in inputs.values()), default=0.0)
    return Drawn(dict(scalars), inputs, [], summary, peak)


def _timed(p: Plan, fn: KernelFunction, drawn: Drawn) -> tuple[dict[int, np.ndarray] | None, float]:
    """The committed kernel's written, finite outputs on `drawn` (None if not) and the call's seconds."""
    values = call_arguments(p, fn, drawn)
    began = time.perf_counter()
    fn.raw(*values)
    took = time.perf_counter() - began
    return written_outputs(fn, values), took
