"""Transfer with doubt: the experience graph's past points as a prior for this operator's effect model.

Each *source* (an operator's task on some hardware) is fitted once, on its own points, into per-value
contrasts over the axes it shares with this space. What the sources say becomes the *prior mean* of
this operator's additive model (`effects.py`), never data: one verdict of this operator on a value
outweighs any number of transferred ones, so the graph orders what has not been tried and this
operator's measurements decide the rest.

A source's weight is its closeness (same operator and hardware most) times its *trust*, measured from
the first verdict on: over the pairs of this operator's verdicts that differ by more than the noise
and that the source can rank (it knows every value in which the two points differ), trust is
``(PRIOR_PAIRS + concordant - discordant) / (PRIOR_PAIRS + concordant + discordant)``, floored at 0.
It starts at 1 and a source that ranks pairs wrongly drops to 0 within a few verdicts; one that ranks
them at chance fades as pairs accumulate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..spec import Scalar
from .effects import AdditiveModel, Observation, value_key

PRIOR_PAIRS = 2.0  # pseudo-pairs of agreement a source starts with (its closeness is believed at first)
MIN_DIFFERENCE = 0.05  # log speedups closer than this are a tie (timing noise): the pair tells nothing
AXES_FLOOR = 0.5  # a source that knows one of many axes keeps half its closeness; one that knows all, all
DECLARED_WEIGHT = 0.25  # the space's declaration weighs as a trusted source of another family would


@dataclass
class Source:
    """One source's per-value contrasts on this space's axes, its closeness and its measured agreement."""

    name: str
    closeness: float
    contrasts: dict[str, float]  # value key -> effect, anchored to the declared prior's level
    concordant: int = 0
    discordant: int = 0
    measured: int = 0  # verdicts already compared (agreement is counted incrementally)
    lost: int = 0  # points it predicted would beat the incumbent that lost head to head

    @property
    def trust(self) -> float:
        """How far this source's ranking of this operator's verdicts is believed (0..1): a point it
        predicted would win and that lost head to head counts against it as a wrong pair does, even
        when the two timings were too close to make a pair."""
        c, d = self.concordant, self.discordant + self.lost
        return max(0.0, (PRIOR_PAIRS + c - d) / (PRIOR_PAIRS + c + d))

    def predicted_a_win(self, point: Mapping[str, Scalar], incumbent: Mapping[str, Scalar]) -> bool:
        d = self.difference(point, incumbent)
        return d is not None and d > MIN_DIFFERENCE

    @property
    def weight(self) -> float:
        """Closeness times trust: how much the source moves the prior."""
        return self.closeness * self.trust

    def difference(self, a: Mapping[str, Scalar], b: Mapping[str, Scalar]) -> float | None:
        """Predicted log speedup of `a` over `b`; None when they differ in a value the source never saw
        (or not at all)."""
        total, differs = 0.0, False
        for name in a:
            if a[name] == b.get(name):
                continue
            ka, kb = value_key(name, a[name]), value_key(name, b.get(name))
            if ka not in self.contrasts or kb not in self.contrasts:
                return None
            total += self.contrasts[ka] - self.contrasts[kb]
            differs = True
        return total if differs else None


def fit_source(
    name: str,
    closeness: float,
    observations: Sequence[Observation],
    axes: Mapping[str, Sequence[Scalar]],
    declared: Mapping[str, float],
) -> Source | None:
    """A source from its points (broken ones already placed below its worst correct one). Each axis's
    contrasts are centered on the values the source saw and anchored to the declared prior's mean over
    those values, so a source moves the prior only where it disagrees with the declaration. None when
    the source tells nothing about this space (no axis with two values seen)."""
    model = AdditiveModel(axes).fit(observations)
    estimates = model.estimates()
    contrasts: dict[str, float] = {}
    for axis, values in axes.items():
        seen = [k for v in values if estimates[k := value_key(axis, v)].count > 0]
        if len(seen) < 2:
            continue
        center = sum(estimates[k].effect for k in seen) / len(seen)
        level = sum(declared.get(k, 0.0) for k in seen) / len(seen)
        contrasts.update({k: estimates[k].effect - center + level for k in seen})
    if not contrasts:
        return None
    tunable = [a for a, values in axes.items() if len(values) > 1]
    shared = len({k.partition("=")[0] for k in contrasts}) / max(1, len(tunable))
    return Source(name, closeness * (AXES_FLOOR + (1.0 - AXES_FLOOR) * shared), contrasts)


def measure_agreement(
    sources: Sequence[Source], observed: Sequence[tuple[Mapping[str, Scalar], float]]
) -> None:
    """Count, for each source, the pairs of this operator's verdicts it ranks rightly and wrongly
    (`observed` only grows: the pairs a new verdict makes are added to the counts)."""
    for source in sources:
        for i in range(source.measured, len(observed)):
            a, ya = observed[i]
            for b, yb in observed[:i]:
                if abs(ya - yb) < MIN_DIFFERENCE:
                    continue
                predicted = source.difference(a, b)
                if predicted is None or abs(predicted) < 1e-9:
                    continue
                if (predicted > 0) == (ya > yb):
                    source.concordant += 1
                else:
                    source.discordant += 1
        source.measured = len(observed)


def graph_prior(
    sources: Sequence[Source], declared: Mapping[str, float], axes: Mapping[str, Sequence[Scalar]]
) -> dict[str, float]:
    """The prior mean of each value: the declared prior, moved towards the sources' weighted mean
    contrast in proportion to their total weight (the declaration counting as `DECLARED_WEIGHT`). A
    value no source knows, on an axis where they know others, is as promising as the best of those:
    the graph's silence on it is no evidence against it."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for source in sources:
        w = source.weight
        if w <= 0:
            continue
        for key, contrast in source.contrasts.items():
            sums[key] = sums.get(key, 0.0) + w * contrast
            weights[key] = weights.get(key, 0.0) + w
    prior = dict(declared)
    for key, total in weights.items():
        d = declared.get(key, 0.0)
        prior[key] = (DECLARED_WEIGHT * d + sums[key]) / (DECLARED_WEIGHT + total)
    for axis, values in axes.items():
        keys = [value_key(axis, v) for v in values]
        known = [prior[k] for k in keys if k in weights]
        for k in keys if known else []:
            if k not in weights:
                prior[k] = max(prior.get(k, 0.0), max(known))
    return prior


def losers(sources: Sequence[Source], axes: Mapping[str, Sequence[Scalar]]) -> set[str]:
    """The values the trusted sources rank, on their weighted mean, below the best value of the axis
    they know by more than the noise: the graph arm need not try them first (the explore arm still
    covers them)."""
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    for source in sources:
        for key, contrast in source.contrasts.items() if source.weight > 0 else ():
            sums[key] = sums.get(key, 0.0) + source.weight * contrast
            weights[key] = weights.get(key, 0.0) + source.weight
    out: set[str] = set()
    for axis, values in axes.items():
        mean = {k: sums[k] / weights[k] for v in values if (k := value_key(axis, v)) in weights}
        top = max(mean.values(), default=0.0)
        out.update(k for k, m in mean.items() if m < top - MIN_DIFFERENCE)
    return out
