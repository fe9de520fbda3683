"""Comparison helpers for correctness tests: strict enough that a lazy kernel cannot pass."""

from __future__ import annotations

from typing import Any

import numpy as np

# Set to a list in the committed kernel's judging child: each `assert_close` call appends its norm-wise
# bound, the error it saw and whether its relative part decided it (rtol * scale >= atol), from which
# the bar every output check uses is made (`arrays.timed_rtol`, `loosest`).
ASSERTED: list[tuple[float, float, bool]] | None = None


def loosest(asserted: list[tuple[float, float, bool]]) -> tuple[float, float] | None:
    """The loosest norm-wise bound the tests set and the largest error they saw, over the asserts
    their relative tolerance decided (over all when none was): an absolute floor on a reference that
    is nearly all zero (gelu of one value deep in its negative tail) is a bound of 10^14 relative to
    it, which says nothing of the precision the tests ask for everywhere else."""
    decided = [a for a in asserted if a[2]] or asserted
    return (max(a[0] for a in decided), max(a[1] for a in decided)) if decided else None


def assert_close(
    actual: Any, expected: Any, rtol: float = 1e-5, atol: float = 0.0, what: str = "output"
) -> None:
    """Assert `actual` matches `expected` within `rtol` of the reference's largest magnitude.

    The error is the largest absolute difference divided by the largest reference magnitude, so an
    all-zero softmax (error = max|expected|) fails whatever the shape. NaN or inf must match exactly
    in place; a shape or dtype mismatch fails. `atol` is an absolute floor for all-zero references.
    """
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    bad_a, bad_e = ~np.isfinite(a64), ~np.isfinite(e64)
    if (bad_a != bad_e).any():
        idx = np.argwhere(bad_a != bad_e)[0]
        raise AssertionError(
            f"{what}: non-finite mismatch at {tuple(idx)}: got {a64[tuple(idx)]}, expected {e64[tuple(idx)]}"
        )
    ok = ~bad_e
    if not ok.any():
        return
    diff = np.abs(a64[ok] - e64[ok])
    scale = float(np.abs(e64[ok]).max())
    worst = float(diff.max())
    limit = atol + rtol * scale
    if ASSERTED is not None and scale > 0:
        ASSERTED.append((limit / scale, worst / scale, rtol * scale >= atol))
    if worst > limit:
        flat = int(np.argmax(np.where(ok, np.abs(a64 - e64), -1.0)))
        idx = np.unravel_index(flat, a.shape)
        raise AssertionError(
            f"{what}: max error {worst:.3g} > {limit:.3g} (rtol={rtol:g} of max |expected| {scale:.3g}, "
            f"atol={atol:g}); worst at {tuple(int(i) for i in idx)}: got {a64[idx]:.7g}, "
            f"expected {e64[idx]:.7g}"
        )
