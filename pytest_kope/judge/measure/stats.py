"""Robust statistics for timings: medians, IQR, and a distribution-free bound on a paired ratio."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Stats:
    """Per-call seconds over the measured rounds."""

    rounds: int
    iterations: int  # calls per round
    median: float
    iqr: float
    min: float
    max: float

    @classmethod
    def of(cls, per_call: list[float], iterations: int) -> Stats:
        q = statistics.quantiles(per_call, n=4) if len(per_call) > 1 else [per_call[0]] * 3
        return cls(
            len(per_call), iterations, statistics.median(per_call), q[2] - q[0], min(per_call), max(per_call)
        )


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Order-statistic confidence interval of the median (sign-test based, no distribution assumed).

    With fewer than 6 values no 95% interval exists, so the full range is returned: then a ratio
    counts as a gain only if every round showed it.
    """
    xs = sorted(values)
    n = len(xs)
    alpha = (1 - confidence) / 2
    k, cum = 0, 0.0
    for j in range(n):  # largest k with P(Binomial(n, 1/2) < k) <= alpha
        cum += math.comb(n, j) / 2**n
        if cum > alpha:
            break
        k = j + 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


@dataclass(frozen=True)
class PairedRatio:
    """reference time / candidate time, per interleaved round: > 1 means the candidate is faster."""

    median: float
    low: float
    high: float
    rounds: int

    @classmethod
    def of(cls, reference: list[float], candidate: list[float]) -> PairedRatio:
        ratios = [r / c for r, c in zip(reference, candidate) if c > 0]
        low, high = median_ci(ratios)
        return cls(statistics.median(ratios), low, high, len(ratios))

    def beats(self, min_gain: float) -> bool:
        """A gain beyond noise: the whole interval above 1 and the median above 1 + min_gain."""
        return self.low > 1.0 and self.median > 1.0 + min_gain
