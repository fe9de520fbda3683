"""The committed kernel's own error on one call, measured: the one thing the repo's bar is relaxed by
(`differential.compare`).

Drawn and replayed calls are held to the tests' tolerance, yet some of them ask more of float
arithmetic than any test does: logits of 10^3 lose 6e-5 of their exponent to rounding before any
kernel sees them; a float32 sum along a run of 4000 equal values rounds the same way 4000 times, and
the committed kernel's own row sum is then 4e-5 from the truth, twice the tests' tolerance. There an
honest candidate and the committed kernel differ by more than the tests' tolerance, and neither is
wrong. What they may differ by is measured on the call itself, two ways, the larger counting:

- how far the outputs move when each floating input element moves by one unit of its own rounding
  (up or down at random): the error the inputs' rounding alone forces on any kernel;
- for a kernel whose outputs scale exactly with its inputs (f(2x) = 2^k f(x) bit for bit on the call,
  as a sum, a matrix product or a copy does), how far f(3x) / 3^k is from f(x): the same mathematics
  rounded another way, which shows the error the kernel's own order of operations makes. A
  normalization with an `eps` is measured so at x * 2^m, where the eps is below rounding and every
  mantissa is still x's.

Honest kernels differ from each other by about that much (each carries an error of that size); a
candidate is allowed `FACTOR` times it on top of the bar. A cheap approximation stays an error of its
own size: 2.4e-3 of an exp is 2.4e-3 wherever it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

FACTOR = 3.0  # the committed kernel's error and the candidate's, each about the measured one, with margin
SEED = 0x5EED  # perturbations need not be secret: the outputs decide, the bar only widens
SCALES = (
    0,
    12,
    24,
)  # 2^m tried in turn: 1, then large enough that an eps of 1e-6 on a mean square of 1e-6 is below rounding
DEGREES = (0, 1, 2, 3)  # f(2x) = 2^k f(x) tried for these k (a sum 1, a product of two inputs 2)

Call = Callable[[dict[int, np.ndarray]], "dict[int, np.ndarray] | None"]


def own_error(
    call: Call, inputs: Mapping[int, np.ndarray], outputs: Mapping[int, np.ndarray]
) -> float | None:
    """`FACTOR` times the committed kernel's measured error on the call; `call(inputs)` runs it and
    gives its written, finite outputs (None: some are not). None: its outputs are not robust (not
    finite, or not written) when the inputs move by their rounding."""
    moved = call({i: _rounded_away(x, np.random.default_rng(SEED + i)) for i, x in inputs.items()})
    if moved is None:
        return None
    worst = 0.0
    for i, want in outputs.items():
        change = _change(moved[i], want)
        if change is None:
            return None
        worst = max(worst, change)
    return FACTOR * max(worst, _reordered(call, inputs, outputs))


def _reordered(call: Call, inputs: Mapping[int, np.ndarray], outputs: Mapping[int, np.ndarray]) -> float:
    """max|f(3sx) / 3^k - f(sx)| over max|f(sx)| at the first scale s = 2^m of `SCALES` where the
    kernel is homogeneous of degree k on the call, bit for bit (0 where it is at none, or where the
    scaled inputs leave the floating range). Scaling by 2^m keeps every mantissa, so the kernel's
    own rounding along the way is the same at s as at 1; it lets constants such as an `eps` vanish
    below rounding, where a normalization becomes homogeneous (f(2sx) = f(sx))."""
    floating = [i for i, x in inputs.items() if x.dtype.kind == "f"]
    if not floating or not all(o.dtype.kind == "f" for o in outputs.values()):
        return 0.0
    for m in SCALES:
        base = outputs if m == 0 else call(_scaled(inputs, floating, 2.0**m))
        doubled = call(_scaled(inputs, floating, 2.0 ** (m + 1))) if base is not None else None
        degree = _degree(doubled, base) if base is not None and doubled is not None else None
        if base is None or degree is None:
            continue
        tripled = call(_scaled(inputs, floating, 3.0 * 2.0**m))
        if tripled is None:
            return 0.0
        worst = 0.0
        for i, want in base.items():
            with np.errstate(over="ignore", invalid="ignore"):
                change = _change(tripled[i].astype(np.float64) / 3.0**degree, want)
            worst = max(worst, change or 0.0)
        return worst
    return 0.0


def _scaled(inputs: Mapping[int, np.ndarray], floating: list[int], factor: float) -> dict[int, np.ndarray]:
    with np.errstate(over="ignore"):
        return {i: (x * x.dtype.type(factor) if i in floating else x.copy()) for i, x in inputs.items()}


def _degree(doubled: Mapping[int, np.ndarray], outputs: Mapping[int, np.ndarray]) -> int | None:
    """The k with doubled == 2^k * outputs bit for bit on every output (None: no such k)."""
    for k in DEGREES:
        if all(
            np.array_equal(doubled[i], o * o.dtype.type(2.0**k), equal_nan=True) for i, o in outputs.items()
        ):
            return k
    return None


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
