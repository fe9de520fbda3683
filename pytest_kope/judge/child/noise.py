"""The committed kernel's own error on one call: how far its outputs move when its inputs move by
their own rounding. The one thing the repo's bar is relaxed by (`differential.compare`).

Drawn and replayed calls are held to the tests' tolerance, yet some of them ask more of float
arithmetic than any test does: logits of 10^3 lose 6e-5 of their exponent to rounding before any
kernel sees them, a row of equal values has a variance made of rounding alone. There an honest
candidate and the committed kernel differ by more than the tests' tolerance, and neither is wrong.
What they may differ by is measured on the call itself: each floating input element is moved by
one unit of its own rounding (up or down at random), the committed kernel runs on it, and the
largest change of its outputs, norm-wise as every check compares, is the call's error. Honest kernels
differ from each other by about that much (each carries an error of that size); a candidate is
allowed `FACTOR` times it on top of the bar. A cheap approximation stays an error of its own size, at any input: 2.4e-3 of an exp is
2.4e-3 wherever it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

FACTOR = 3.0  # the committed kernel's error and the candidate's, each about the measured one, with margin
TRIES = 1  # perturbations measured per call (each costs a call of the committed kernel); the largest counts
SEED = 0x5EED  # perturbations need not be secret: the outputs decide, the bar only widens


def own_error(
    call: Callable[[dict[int, np.ndarray]], dict[int, np.ndarray] | None],
    inputs: Mapping[int, np.ndarray],
    outputs: Mapping[int, np.ndarray],
) -> float | None:
    """`FACTOR` times the largest norm-wise change of `outputs` when `inputs` move by a unit of their
    rounding; `call(inputs)` runs the committed kernel and gives its written outputs (None: some
    left unwritten). None: the outputs are not robust (non-finite, unwritten) under such a move."""
    rng = np.random.default_rng(SEED)
    worst = 0.0
    for _ in range(TRIES):
        moved = {i: _rounded_away(x, rng) for i, x in inputs.items()}
        got = call(moved)
        if got is None:
            return None
        for i, want in outputs.items():
            change = _change(got[i], want)
            if change is None:
                return None
            worst = max(worst, change)
    return FACTOR * worst


def _rounded_away(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`x` with each finite floating element one unit of its rounding up or down (others as given)."""
    if x.dtype.kind != "f":
        same: np.ndarray = x.copy()
        return same
    ulp = np.spacing(np.abs(x).astype(x.dtype))
    with np.errstate(invalid="ignore", over="ignore"):
        moved = x + np.where(rng.random(x.shape) < 0.5, -ulp, ulp).astype(x.dtype)
    out: np.ndarray = np.where(np.isfinite(x), moved, x).astype(x.dtype)
    return out


def _change(got: np.ndarray, want: np.ndarray) -> float | None:
    """max|got - want| over max|want|, on the elements `want` has finite; None where `got` is not
    finite there (the call is not robust to its inputs' rounding)."""
    if want.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, want) else None
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    if not np.isfinite(g[finite]).all():
        return None
    if not finite.any():
        return 0.0
    scale = float(np.abs(w[finite]).max())
    worst = float(np.abs(g[finite] - w[finite]).max())
    return worst / scale if scale > 0 else (0.0 if worst == 0 else None)
