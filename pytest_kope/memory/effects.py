"""What each parameter value did: a ridge-regularized additive model of log speedup.

Observations are points of a tuning space (``{"VEC": 8, "THREADS": 2}``) with the log of their
speedup, each from a *source* (an operator's task on some hardware: its baseline, hence its
intercept, is its own) and with a weight. The model is

    log speedup = intercept[source] + sum over the point's values of effect[name=value]
                                    (+ pairwise terms, shrunk harder, when asked)

fitted by weighted ridge regression (a Gaussian prior of precision ``ridge`` on every effect, a flat
one on the intercepts). It is a Bayesian linear model, so each value's effect comes with a standard
error and each point's prediction with its uncertainty; `sample` draws a whole effect vector from the
posterior (Thompson sampling). A multi-parameter jump no longer credits its whole effect to each value
it changed: the fit splits it among them, the more cleanly the more points it has seen.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..spec import Scalar

Array = npt.NDArray[np.float64]
NOISE = 0.2  # prior guess of the residual sd of log speedup (timing noise and what the model misses)
EFFECT_SD = 1.0  # prior sd of a main effect (log units: 2.7x either way is plausible)
PAIR_SD = 0.4  # interactions are shrunk harder: they need more evidence than main effects
RIDGE = (NOISE / EFFECT_SD) ** 2  # ridge penalties are prior precisions in units of the noise variance
PAIR_RIDGE = (NOISE / PAIR_SD) ** 2
NOISE_PRIOR_COUNT = 3.0  # the noise estimate starts at NOISE and follows the residuals as data comes
MIN_NOISE = 0.03  # floor of the residual sd (paired timing noise is a few %)


@functools.lru_cache(maxsize=1)
def _blas() -> Any:
    """threadpoolctl's controller, when installed: BLAS threads on these small matrices cost more than
    they give, and on a loaded 2-core machine OpenBLAS's spinning threads made one 200x200 Cholesky
    take 0.7 s instead of a millisecond."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def one_blas_thread() -> Any:
    """A context in which BLAS runs single-threaded (a no-op without threadpoolctl)."""
    controller = _blas()
    return controller.limit(limits=1, user_api="blas") if controller is not None else contextlib.nullcontext()


@functools.lru_cache(maxsize=4096)
def _value_key(name: str, value: Scalar | None) -> str:
    return f"{name}={json.dumps(value, sort_keys=True, default=str)}"


def value_key(name: str, value: Scalar | None) -> str:
    """The column of one parameter value: ``VEC=8``, ``flags="-O2"`` (values JSON-encoded; None: a
    point without the axis)."""
    return _value_key(name, value)


@dataclass
class Observation:
    """One judged point of a space: its values, its log speedup, and how much it counts."""

    point: Mapping[str, Scalar]
    y: float  # log speedup against the source's own baseline
    source: str = "self"
    weight: float = 1.0


@dataclass
class Estimate:
    """One value's fitted effect on log speedup, its standard error, and how many points had it."""

    key: str
    effect: float
    se: float
    count: int

    @property
    def ratio(self) -> float:
        return math.exp(self.effect)


@dataclass
class AdditiveModel:
    """Fit on `fit(observations)`; predict, sample and read per-value estimates afterwards.

    `axes` fixes the columns: only values of these axes are modelled (a source from another space
    contributes through the axes it shares; its other parameters are ignored).
    """

    axes: Mapping[str, Sequence[Scalar]]
    pairs: bool = False
    prior_mean: Mapping[str, float] = field(default_factory=dict)  # value key -> prior effect (else 0)
    ridge: float = RIDGE
    pair_ridge: float = PAIR_RIDGE
    columns: list[str] = field(default_factory=list, init=False)
    sources: list[str] = field(default_factory=list, init=False)
    mean: Array = field(default_factory=lambda: np.zeros(0), init=False)
    cov: Array = field(default_factory=lambda: np.zeros((0, 0)), init=False)
    counts: dict[str, int] = field(default_factory=dict, init=False)
    noise: float = field(default=MIN_NOISE, init=False)
    intercepts: dict[str, float] = field(default_factory=dict, init=False)
    fitted: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        mains = [value_key(n, v) for n, values in self.axes.items() for v in values]
        self.columns = list(mains)
        if self.pairs:
            names = list(self.axes)
            for a, b in itertools.combinations(names, 2):
                for va, vb in itertools.product(self.axes[a], self.axes[b]):
                    self.columns.append(value_key(a, va) + "&" + value_key(b, vb))
        self._index = {c: i for i, c in enumerate(self.columns)}
        self._main = len(mains)
        self._prior = np.array([self.prior_mean.get(c, 0.0) for c in self.columns])
        self.mean = self._prior.copy()
        self.cov = self._prior_cov()

    def _prior_cov(self) -> Array:
        pairs = len(self.columns) - self._main
        return np.diag(np.concatenate([np.full(self._main, EFFECT_SD**2), np.full(pairs, PAIR_SD**2)]))

    def keys(self, point: Mapping[str, Scalar]) -> list[str]:
        mains = [value_key(n, point[n]) for n in self.axes if n in point]
        out = [k for k in mains if k in self._index]
        if self.pairs:
            out += [k for a, b in itertools.combinations(mains, 2) if (k := a + "&" + b) in self._index]
        return out

    def design(self, points: Iterable[Mapping[str, Scalar]]) -> Array:
        rows = list(points)
        x = np.zeros((len(rows), len(self.columns)))
        for i, point in enumerate(rows):
            for k in self.keys(point):
                x[i, self._index[k]] = 1.0
        return x

    def fit(self, observations: Sequence[Observation]) -> AdditiveModel:
        """Weighted ridge fit with one free intercept per source; sets effects, covariance, noise."""
        obs = [o for o in observations if o.weight > 0 and self.keys(o.point)]
        self.fitted = len(obs)
        self.counts = {}
        for o in obs:
            for k in self.keys(o.point):
                self.counts[k] = self.counts.get(k, 0) + 1
        p = len(self.columns)
        if not obs:
            self.mean, self.cov, self.sources = self._prior.copy(), self._prior_cov(), []
            return self
        self.sources = sorted({o.source for o in obs})
        s_index = {s: i for i, s in enumerate(self.sources)}
        x = self.design(o.point for o in obs)
        z = np.zeros((len(obs), len(self.sources)))
        for i, o in enumerate(obs):
            z[i, s_index[o.source]] = 1.0
        full = np.hstack([x, z])
        w = np.array([o.weight for o in obs])
        y = np.array([o.y for o in obs])
        prior = np.concatenate(
            [
                np.full(self._main, self.ridge),
                np.full(p - self._main, self.pair_ridge),
                np.full(len(self.sources), 1e-4),  # intercepts: all but flat
            ]
        )
        with one_blas_thread():
            precision = full.T @ (full * w[:, None]) + np.diag(prior)
            try:
                cov = np.linalg.inv(precision)  # symmetric positive definite: every column has a prior
            except np.linalg.LinAlgError:
                cov = np.linalg.pinv(precision)
        shift = np.concatenate([self._prior, np.zeros(len(self.sources))])
        beta = cov @ (full.T @ (w * y) + prior * shift)  # shrunk towards the prior mean, not 0
        resid = y - full @ beta
        dof = max(0.0, float(w.sum()) - min(len(beta), float(w.sum()) / 2))
        ssr = float((w * resid**2).sum())
        self.noise = max(
            MIN_NOISE, math.sqrt((NOISE_PRIOR_COUNT * NOISE**2 + ssr) / (NOISE_PRIOR_COUNT + dof))
        )
        self.mean = beta[:p]
        self.intercepts = dict(zip(self.sources, beta[p:].tolist()))
        self.cov = cov[:p, :p] * self.noise**2
        return self

    def predict(self, points: Sequence[Mapping[str, Scalar]]) -> tuple[Array, Array]:
        """Predicted log speedup (without intercept: comparable within one source) and its std."""
        x = self.design(points)
        mu = x @ self.mean
        var = np.einsum("ij,jk,ik->i", x, self.cov, x)
        return mu, np.sqrt(np.maximum(var, 0.0))

    def sample(self, rng: np.random.Generator) -> Array:
        """One effect vector from the posterior (Thompson sampling)."""
        try:
            with one_blas_thread():
                chol = np.linalg.cholesky(self.cov + 1e-12 * np.eye(len(self.mean)))
        except np.linalg.LinAlgError:
            copied: Array = self.mean.copy()
            return copied
        drawn: Array = self.mean + chol @ rng.standard_normal(len(self.mean))
        return drawn

    def contrast(self, key: str, reference: str) -> Estimate | None:
        """The effect of value `key` against value `reference` of the same axis (e.g. its default),
        with the standard error of the difference; None when either is not a column."""
        i, j = self._index.get(key), self._index.get(reference)
        if i is None or j is None:
            return None
        diff = float(self.mean[i] - self.mean[j])
        var = float(self.cov[i, i] + self.cov[j, j] - 2 * self.cov[i, j])
        return Estimate(key, diff, math.sqrt(max(var, 0.0)), self.counts.get(key, 0))

    def estimates(self) -> dict[str, Estimate]:
        """Each main effect with its standard error and count (values never seen keep the prior)."""
        se = np.sqrt(np.maximum(np.diag(self.cov), 0.0))
        return {
            c: Estimate(c, float(self.mean[i]), float(se[i]), self.counts.get(c, 0))
            for i, c in enumerate(self.columns[: self._main])
        }


def agreement(predicted: Sequence[float], observed: Sequence[float]) -> float | None:
    """Pearson correlation of a source's predictions with what this operator showed (None: too few)."""
    if len(observed) < 3:
        return None
    a, b = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    if a.std() < 1e-9 or b.std() < 1e-9:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])
