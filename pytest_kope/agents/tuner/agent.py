"""The offline agent: searches the tuning space a kernel declares, no key needed.

Strategy: Thompson sampling over an additive model of log speedup (memory/effects.py: one effect per
parameter value, pairwise interactions shrunk harder, each with its uncertainty), refit after every
verdict on this operator's verdicts alone. The experience graph enters only as the model's *prior
mean* (memory/transfer.py): each source (other runs of this operator, its family, other families;
this hardware, its arch, other machines) is fitted once into per-value contrasts and weighted by its
closeness times how well it has ranked this operator's verdicts so far, from the first verdict on (a
source that ranks pairs wrongly drops to nothing within a few verdicts). One verdict on a value
outweighs what the graph says of it; with an empty graph the prior is the space's declaration alone.

Two arms, chosen by a Beta-Bernoulli bandit on "did the proposal beat the incumbent":

- **graph**: the point the model ranks best (its mean) among those that try at least one value not
  yet tried (values the trusted sources agree lose do not count): a step where the graph and the
  verdicts point, not a jump over every untried axis at once. When the budget left is no more than
  what covering the untried values takes, it too tries the most untried values a point can;
- **explore**: a Thompson draw, among the points that try the most values not yet tried, whatever
  the graph says of them (the cold tuner is this arm alone).

When graph-led proposals stop beating the incumbent, the bandit shifts to exploring; with an empty
graph only the explore arm exists. After GRAPH_PATIENCE verdicts without a gain a warm run drops the
graph altogether (`state.drop_graph`): a sibling's optimum at another shape holds a search the
graph's prior still leads, while the graph keeps its trust by ranking the big effects right.
`explore_rate` is the least share of proposals the explore arm gets. No value is ruled out by a
lesson: every value of every axis gets tried before the budget is spent unless the budget is smaller
than what covering them takes (then `usage()["untried"]` names them). State is kept per operator:
what one operator's search saw never skews another's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ...candidate import Candidate
from ...judge.outcome import Judged, Outcome
from ...memory.effects import AdditiveModel, Observation, value_key
from ...memory.points import PastPoint
from ...memory.transfer import fit_source, graph_prior, losers, measure_agreement
from ...settings import DEFAULTS
from ...spec import Point, Scalar, TuningSpace, parse_spec
from ..base import AgentBase, Context
from . import exploration as ex
from . import state as st

FAILED_DROP = 1.0  # a broken point counts as this much log speedup below the worst correct one seen
POOL = 4000  # points scored per round when the space is larger than this
EXPLORE_RATE = DEFAULTS["kope_explore"]
OPERATOR_WEIGHT = {"operator": 1.0, "family": 0.5, "other": 0.25}  # how a source relates to this task
HARDWARE_WEIGHT = {"hardware": 1.0, "arch": 0.5, "other": 0.25}
THOMPSON_SCALE = 0.25  # posterior draws shrunk towards the mean: explore less than full Thompson
GRAPH_SCALE = 0.0  # the graph arm follows its model's mean (ties broken at random)
DECLARED_GAIN = 0.1  # prior log gain of a declared non-default value (see _declared_prior)
DISCOUNT = 0.9  # the bandit forgets old rewards: the graph can stop paying midway
PROBE_AFTER = 3  # evaluations without a gain after which an unexplored axis is probed
GRAPH_PATIENCE = 4  # verdicts without a gain after which a warm run goes on as a cold one (drop_graph)


class Tuner(AgentBase):
    """Searches the tuning space the source declares, ordered by the experience graph."""

    name = "tuner"
    needs_jail = False  # it only rebuilds the committed source at other declared values
    tunes_spaces = True

    def __init__(
        self, seed: int = 0, explore_rate: float = EXPLORE_RATE, ucb: float = 0.3, recall_items: int = 12
    ):
        self.rng = np.random.default_rng(seed)
        self.explore_rate = explore_rate
        self.ucb = ucb  # kept for callers; Thompson sampling replaced the UCB bonus
        self.recall_items = recall_items
        self.searches: dict[str, st.Search] = {}
        self.proposed: set[str] = set()
        self._hashes: dict[tuple[str, str], str] = {}  # (base hash, point) -> candidate hash
        self.done: str | None = None  # why the last propose() returned nothing, when it did

    def _base(self, ctx: Context) -> tuple[Candidate, TuningSpace]:
        """Tune the incumbent's own space when it declares one (an LLM may add knobs), else the committed."""
        inc = ctx.incumbent.candidate
        own = parse_spec(inc.source, inc.filename).space
        if own.axes:
            return inc, _held(own, ctx.operator.space)
        return ctx.baseline.candidate, ctx.operator.space

    def _start(self, ctx: Context, space: TuningSpace) -> st.Search:
        s = self.searches[ctx.operator.name] = st.Search(space)
        if space.allows(ctx.baseline.candidate.params):  # the committed kernel is a verdict too
            s.observed.append((dict(ctx.baseline.candidate.params), math.log(ctx.baseline.speedup or 1.0)))
            s.tried.update(value_key(k, v) for k, v in ctx.baseline.candidate.params.items())
        s.centre = s.on_space(ctx.incumbent.candidate.params)
        s.judged = [s.on_space(j.candidate.params) for j in (ctx.baseline, *ctx.history)]
        best = ctx.incumbent.speedup or 1.0
        state = "no kernel yet" if not ctx.history else f"correct at {best:.2f}x of baseline"
        try:
            recall = ctx.recall(state=state, budget=self.recall_items, points=True)
        except TypeError:  # a recall without the points option (an older caller): no graph data
            recall = ctx.recall(state=state, budget=self.recall_items)
        rows: dict[str, list[tuple[Point, float | None]]] = {}
        closeness: dict[str, float] = {}
        evidence: list[tuple[str, Point]] = []
        past: list[PastPoint] = getattr(recall, "points", None) or []
        for row in past:
            source, relation = str(row["source"]), str(row["relation"])
            speedup = row.get("speedup")
            y = math.log(speedup) if row.get("correct") and speedup else None
            rows.setdefault(source, []).append((dict(row["params"]), y))
            if relation == "operator/hardware":  # judged here before: those values count as tried
                s.tried.update(value_key(k, v) for k, v in row["params"].items() if k in space.axes)
                s.judged.append(s.on_space(row["params"]))
            evidence.append((relation, row["params"]))
            op_rel, _, hw_rel = relation.partition("/")
            closeness[source] = OPERATOR_WEIGHT.get(op_rel, 0.25) * HARDWARE_WEIGHT.get(hw_rel, 0.25)
        declared = _declared_prior(space)
        for source, points in rows.items():
            if sum(y is not None for _, y in points) < 2:  # no contrast to learn (e.g. a lone baseline)
                continue
            fitted = fit_source(
                source, closeness[source], _observations(points, source, 1.0), space.axes, declared
            )
            if fitted is not None:
                s.sources[source] = fitted
        s.known = ex.known_axes(space, evidence)
        s.arms["explore"] = [1.0, 1.0]
        if s.sources:
            s.arms["graph"] = [2.0, 1.0]  # trust the graph first; the verdicts decide how long
        return s

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        self.done = None
        base, space = self._base(ctx)
        if not space.axes:  # nothing to tune: not a converged search, the loop reports "agent done"
            return []
        s = self.searches.get(ctx.operator.name) or self._start(ctx, space)
        pool = [p for p in self._pool(s, space) if self._untried(ctx, base, p)]
        if not pool:
            self.done = "tried every point of the tuning space"
            return []
        self._refit(s)
        if space.allows(ctx.incumbent.candidate.params):  # another agent's winner is the centre too
            s.centre = s.on_space(ctx.incumbent.candidate.params)
        out: list[Candidate] = []
        probed: set[str] = set()
        for k in range(min(n, len(pool))):
            arm = "probe"
            point = self._probe(ctx, s, base, probed) if self._probing(s) else None
            if point is None:
                arm = self._arm(s)
                point = pool.pop(self._pick(s, arm, pool, ctx.budget_left - k))
            elif point in pool:
                pool.remove(point)
            cand = self._candidate(base, point, arm)
            s.arm_of[cand.hash] = arm
            s.pulls[arm] = s.pulls.get(arm, 0) + 1
            s.last_arm = arm
            s.tried.update(value_key(k, v) for k, v in point.items())
            self.proposed.add(cand.hash)
            out.append(cand)
        return out

    def _probing(self, s: st.Search) -> bool:
        """Whether the next proposal probes an unexplored axis: in a warm run, its first proposal after
        its first two once a verdict is back (the graph's first guesses go first, and a probe moves one
        axis from a judged incumbent: the third proposal of a first batch of four probed around the
        committed kernel), and every other proposal once PROBE_AFTER verdicts brought no gain (the arms
        keep the rest: covering untried values finds more on a small space)."""
        if s.sources and s.verdicts and sum(s.pulls.values()) >= 2 and not s.guessed:
            s.guessed = True
            return True
        return s.since_gain >= PROBE_AFTER and s.last_arm != "probe"

    def _probe(self, ctx: Context, s: st.Search, base: Candidate, probed: set[str]) -> Point | None:
        """The incumbent moved on the first unexplored axis not probed in this batch, to the value
        the model ranks best; None when there is none left to probe."""
        assert s.model is not None
        for axis in s.unexplored():
            if axis in probed:
                continue
            near = [p for p in ex.neighbours(s.space, s.centre, axis) if self._untried(ctx, base, p)]
            if near:
                probed.add(axis)
                scores = s.model.design(near) @ s.model.mean + 1e-9 * self.rng.random(len(near))
                return near[int(np.argmax(scores))]
        return None

    def _arm(self, s: st.Search) -> str:
        """Thompson sampling between the arms, with the explore arm's floor share."""
        total = sum(s.pulls.values())
        if "graph" not in s.arms or s.pulls.get("explore", 0) < self.explore_rate * (total + 1) - 1:
            return "explore"
        if total == 0:  # the graph's best guess goes first: the verdicts decide how long it leads
            return "graph"
        draws = {arm: self.rng.beta(a, b) for arm, (a, b) in s.arms.items()}
        return max(draws, key=lambda arm: draws[arm])

    def _pick(self, s: st.Search, arm: str, pool: list[Point], budget_left: int) -> int:
        """Index of the pool point that scores best under the model, among the points that try new
        values. The explore arm takes the points that try the most values not yet tried and draws from
        the posterior (Thompson); the graph arm takes any point that tries one, not counting the values
        trusted sources agree lose, and follows the posterior mean, unless the budget left only just
        covers the untried values (then it too takes the points that try the most, losers included)."""
        assert s.model is not None
        step = arm == "graph" and st.covering(s) < budget_left  # else: cover, as the explore arm does
        skip = s.losers if step else set()
        fresh = [
            sum((k := value_key(n, v)) not in s.tried and k not in skip for n, v in p.items()) for p in pool
        ]
        most = max(fresh)
        need = min(most, 1) if step else most
        candidates = [i for i in range(len(pool)) if fresh[i] >= need]
        x = s.model.design([pool[i] for i in candidates])
        scale = THOMPSON_SCALE if arm == "explore" else GRAPH_SCALE
        theta = s.model.mean + scale * (s.model.sample(self.rng) - s.model.mean) if scale else s.model.mean
        scores = x @ theta + 1e-9 * self.rng.random(len(candidates))
        return candidates[int(np.argmax(scores))]

    def _refit(self, s: st.Search) -> None:
        """Refit when a verdict arrived: this operator's verdicts are the data; the prior is the
        space's declaration, moved by the graph's sources, each weighted by closeness times how well it
        has ranked these verdicts so far (with no graph, or no trusted source, the declaration alone)."""
        if s.fitted_at == len(s.observed) and s.model is not None:
            return
        s.fitted_at = len(s.observed)
        prior = _declared_prior(s.space)
        if s.sources and not s.dropped and s.since_gain >= GRAPH_PATIENCE:
            st.drop_graph(s)
        if s.sources and not s.dropped:
            sources = list(s.sources.values())
            measure_agreement(sources, [(p, y) for p, y in s.observed if y is not None])
            s.weights = {source.name: source.weight for source in sources}
            prior = graph_prior(sources, prior, s.space.axes)
            s.losers = losers(sources, s.space.axes)
        own = _observations(s.observed, "self", 1.0)
        s.model = AdditiveModel(s.space.axes, pairs=True, prior_mean=prior).fit(own)

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        s = self.searches.get(ctx.operator.name)
        if s is None:
            return
        for judged in results:
            point = dict(judged.candidate.params)
            s.judged.append(s.on_space(point))
            won = judged.outcome == Outcome.BETTER
            if won and s.space.allows(point):
                s.centre = s.on_space(point)
            s.since_gain = 0 if won else s.since_gain + 1
            s.verdicts += 1
            if judged.outcome.correct and judged.speedup:
                s.observed.append((point, math.log(judged.speedup)))
            elif not judged.outcome.correct and judged.outcome not in (Outcome.REJECTED, Outcome.SUSPECT):
                s.observed.append((point, None))
            arm = s.arm_of.pop(judged.candidate.hash, None)
            if arm == "graph" and not won and judged.outcome.correct:
                st.doubt(s, s.on_space(point), s.on_space(ctx.incumbent.candidate.params))
            if arm in s.arms:
                for a in s.arms.values():  # discount: recent verdicts count most
                    a[0], a[1] = 1.0 + DISCOUNT * (a[0] - 1.0), 1.0 + DISCOUNT * (a[1] - 1.0)
                s.arms[arm][0 if won else 1] += 1.0

    def usage(self) -> dict[str, Any]:
        searches = self.searches.values()
        return {
            "proposals": sum(sum(s.pulls.values()) for s in searches),
            "explorations": sum(s.pulls.get("explore", 0) for s in searches),
            "graph_led": sum(s.pulls.get("graph", 0) for s in searches),
            "probes": sum(s.pulls.get("probe", 0) for s in searches),
            "observations": sum(len(s.observed) for s in searches),
            "graph_sources": sum(len(s.sources) for s in searches),
            "untried": {name: self.untried(name) for name in self.searches if self.untried(name)},
        }

    def untried(self, operator: str) -> list[str]:
        """The values of the space this operator's search has not tried (the budget ran out first)."""
        return [
            f"{n}={v}" for n, values in st.untried_values(self.searches[operator]).items() for v in values
        ]

    def unexplored(self, operator: str) -> list[str]:
        """The axes the graph knows nothing about that this operator's search has not yet tried
        around its incumbent: while there are any, no gain in N evaluations does not stop it."""
        s = self.searches.get(operator)
        return s.unexplored() if s is not None else []

    def exploration(self, operator: str) -> ex.Exploration | None:
        """Which axes were known from the graph, explored around the incumbent, or never explored."""
        s = self.searches.get(operator)
        return ex.exploration(s.space, s.known, s.centre, s.judged) if s is not None else None

    def source_weights(self, operator: str) -> dict[str, float]:
        """Each graph source's weight at the last refit (closeness times measured agreement)."""
        return dict(self.searches[operator].weights)

    def _candidate(self, base: Candidate, point: Mapping[str, Scalar], arm: str = "") -> Candidate:
        changed = {k: v for k, v in point.items() if base.params.get(k) != v}
        idea = "tune " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "declared defaults"
        if arm == "explore" and self.searches and any(s.sources for s in self.searches.values()):
            idea = f"explore: {idea}"
        elif arm == "probe":  # an axis nothing spoke for, moved alone from the incumbent
            idea = f"probe: {idea}"
        return Candidate(base.source, base.filename, base.toolchain, dict(point), idea, self.name, base.hash)

    def _untried(self, ctx: Context, base: Candidate, point: Mapping[str, Scalar]) -> bool:
        try:
            key = repr(sorted(point.items()))
        except TypeError:
            key = json.dumps(point, sort_keys=True, default=str)
        h = self._hashes.get((base.hash, key))
        if h is None:  # the idea is not part of the hash
            h = self._hashes[(base.hash, key)] = self._candidate(base, point).hash
        return h not in self.proposed and h != base.hash and not ctx.seen(h)

    def _pool(self, s: st.Search, space: TuningSpace) -> list[Point]:
        if space.size() <= POOL:
            if s.points is None or s.points[0] is not space:  # enumerated once per search and space
                s.points = (space, list(space.points()))
            return list(s.points[1])
        names = list(space.axes)
        pool: list[Point] = []
        seen: set[str] = set()
        for _ in range(POOL * 3):
            point = {n: space.axes[n][int(self.rng.integers(len(space.axes[n])))] for n in names}
            key = json.dumps(point, sort_keys=True, default=str)
            if key not in seen and space.allows(point):
                seen.add(key)
                pool.append(point)
            if len(pool) >= POOL:
                break
        return pool


def _declared_prior(space: TuningSpace) -> dict[str, float]:
    """A small prior gain for each declared alternative to an axis's default: a space keeps its
    defaults plain and declares the values its author expects may help (before any verdict, a
    non-default value is a better bet than the default)."""
    return {value_key(n, v): DECLARED_GAIN for n, values in space.axes.items() for v in values[1:]}


def _observations(rows: list[tuple[Point, float | None]], source: str, weight: float) -> list[Observation]:
    """Correct points as they are; broken ones FAILED_DROP below the worst correct one of the source."""
    ys = [y for _, y in rows if y is not None]
    floor = (min(ys) if ys else 0.0) - FAILED_DROP
    return [Observation(p, floor if y is None else y, source, weight) for p, y in rows]


def _held(own: TuningSpace, searched: TuningSpace) -> TuningSpace:
    """`own` with every axis the operator holds to one value (`Operator.searched_space`) held there too."""
    held = {n: v for n, v in searched.axes.items() if len(v) == 1 and n in own.axes and v[0] in own.axes[n]}
    return replace(own, axes={**own.axes, **held}) if held else own
