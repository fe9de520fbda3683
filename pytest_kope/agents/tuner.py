"""The offline agent: searches the tuning space a kernel declares, no key needed.

Strategy: model-guided search. A main-effects model (each axis value's mean effect on log speedup,
shrunk towards zero) is fitted to every verdict so far, with the experience graph's recalled lessons
as prior pseudo-observations; the next batch is the unseen points with the best upper confidence
bound. Recalled exemplar points from similar operators and hardware go first.

It does not spend evaluations on what the graph already knows: a point that changes a parameter to a
value the lessons mark as losing on this hardware, for this operator or its family (slower beyond
noise, or broken, in most of at least two tries), is proposed only as a deliberate exploration, at
most `explore_rate` of the proposals: the incumbent with that one value changed, so the verdict is
about that value alone (a point changing several values charges a loss to all of them). When every untried point is such a point, the tuner has
converged: it proposes nothing and says so in `done` (the search then stops). State is kept per
operator: what one operator's search saw never skews another's.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..candidate import Candidate
from ..judge.outcome import Judged
from ..spec import TuningSpace, parse_spec
from .base import Context

FAILED = -1.0  # log-speedup charged to a point that broke correctness or did not build
POOL = 4000  # points scored per round when the space is larger than this
LESSON_ITEMS = 100  # lessons recalled each round to find the losing values (all of a space's values)
HERE = ("operator/hardware", "family/hardware")  # lesson scopes that may veto a value
EXPLORE_RATE = 0.1


def _value_key(name: str, value: Any) -> tuple[str, str]:
    return name, json.dumps(value, sort_keys=True, default=str)


@dataclass
class _Search:
    """One operator's search: verdicts seen, prior from the graph, queued seeds, losing values."""

    observed: list[tuple[dict, float]] = field(default_factory=list)
    prior: dict[tuple[str, Any], float] = field(default_factory=dict)
    queue: list[dict] = field(default_factory=list)
    losing: dict[tuple[str, str], str] = field(default_factory=dict)  # (name, value) -> lesson text
    proposals: int = 0
    explored: int = 0
    cache_key: tuple[int, int] | None = None
    cache: Any = None


class Tuner:
    """Searches the tuning space the source declares, ordered by the experience graph."""

    name = "tuner"

    def __init__(
        self, seed: int = 0, explore_rate: float = EXPLORE_RATE, ucb: float = 0.3, recall_items: int = 12
    ):
        self.rng = random.Random(seed)
        self.explore_rate = explore_rate
        self.ucb = ucb
        self.recall_items = recall_items
        self.searches: dict[str, _Search] = {}
        self.proposed: set[str] = set()
        self.done: str | None = None  # why the last propose() returned nothing, when it did

    def _base(self, ctx: Context) -> tuple[Candidate, TuningSpace]:
        """Tune the incumbent's own space when it declares one (an LLM may add knobs), else the committed."""
        inc = ctx.incumbent.candidate
        own = parse_spec(inc.source, inc.filename).space
        if own.axes:
            return inc, own
        return ctx.baseline.candidate, ctx.operator.space

    def _start(self, ctx: Context, space: TuningSpace) -> _Search:
        s = self.searches[ctx.operator.name] = _Search()
        best = ctx.incumbent.speedup or 1.0
        state = "no kernel yet" if not ctx.history else f"correct at {best:.2f}x of baseline"
        recall = ctx.recall(state=state, budget=self.recall_items)
        for name, value, weight in getattr(recall, "preferred_params", lambda: [])():
            if name in space.axes and value in space.axes[name]:
                s.prior[(name, value)] = s.prior.get((name, value), 0.0) + weight
        for seed in getattr(recall, "seeds", lambda: [])():
            point = {
                **space.defaults,
                **{k: v for k, v in seed.items() if k in space.axes and v in space.axes[k]},
            }
            if point != space.defaults and space.allows(point):
                s.queue.append(point)
        return s

    def _refresh_losing(self, ctx: Context, s: _Search) -> None:
        """The values this hardware's lessons mark as losing, for this operator or its family."""
        recall = ctx.recall(state="", budget=LESSON_ITEMS)
        s.losing = {}
        for lesson in getattr(recall, "lessons", []):
            if lesson.kind == "param" and "param" in lesson.data and lesson.scope in HERE and lesson.losing():
                key = _value_key(lesson.data["param"], lesson.data.get("value"))
                s.losing.setdefault(key, lesson.text)

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        self.done = None
        base, space = self._base(ctx)
        if not space.axes:  # nothing to tune: not a converged search, the loop reports "agent done"
            return []
        s = self.searches.get(ctx.operator.name) or self._start(ctx, space)
        self._refresh_losing(ctx, s)
        fresh, vetoed = self._ranked(ctx, s, base, space, n)
        if not fresh:
            self.done = self._why_converged(s, base, vetoed)
            return []
        due = max(0, math.floor(self.explore_rate * (s.proposals + n)) - s.explored)
        explore = self._explorations(ctx, s, base, space)[: min(due, n - 1)]  # never a whole batch
        chosen = fresh[: n - len(explore)]
        s.proposals += len(chosen) + len(explore)
        s.explored += len(explore)
        out = [self._candidate(base, p) for p in chosen]
        out += [self._candidate(base, p, explore=self._losing_changes(s, base, p)) for p in explore]
        self.proposed.update(c.hash for c in out)
        return out

    def _ranked(
        self, ctx: Context, s: _Search, base: Candidate, space: TuningSpace, n: int
    ) -> tuple[list[dict], list[dict]]:
        """Untried points, best first: those the lessons do not mark as losing (up to `n`), and those
        they do (all of them when no other is left: the count goes into `done`)."""
        scored = sorted(
            ((self._score(s, p), self.rng.random(), p) for p in self._pool(space)),
            key=lambda t: (t[0], t[1]),
            reverse=True,
        )
        fresh: list[dict] = []
        vetoed: list[dict] = []
        seen: set[str] = set()
        for point in [*s.queue, *(p for _, _, p in scored)]:
            key = json.dumps(point, sort_keys=True, default=str)
            if key in seen or not self._untried(ctx, base, point):
                continue
            seen.add(key)
            (vetoed if self._losing_changes(s, base, point) else fresh).append(point)
            if len(fresh) >= n and len(vetoed) >= n:
                break
        return fresh, vetoed

    def _explorations(self, ctx: Context, s: _Search, base: Candidate, space: TuningSpace) -> list[dict]:
        """Re-tests of a losing value: the base with exactly that one value changed (so a verdict is
        about it alone), best scored first."""
        points = []
        for name, value in s.losing:
            options = [v for v in space.axes.get(name, []) if _value_key(name, v) == (name, value)]
            for v in options:
                point = {**base.params, name: v}
                if v != base.params.get(name) and space.allows(point) and self._untried(ctx, base, point):
                    points.append(point)
        return sorted(points, key=lambda p: self._score(s, p), reverse=True)

    def _losing_changes(self, s: _Search, base: Candidate, point: dict) -> list[str]:
        """The point's changes (against the base it would be derived from) that lessons mark as losing."""
        return [
            f"{k}={v}" for k, v in point.items() if base.params.get(k) != v and _value_key(k, v) in s.losing
        ]

    def _why_converged(self, s: _Search, base: Candidate, vetoed: list[dict]) -> str:
        if not vetoed:
            return "tried every point of the tuning space"
        values = sorted({c for p in vetoed for c in self._losing_changes(s, base, p)})
        shown = ", ".join(values[:6]) + (", ..." if len(values) > 6 else "")
        return (
            f"converged: each of the {len(vetoed)} untried points changes a value that lessons on this "
            f"hardware mark as slower or broken ({shown})"
        )

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        s = self.searches.get(ctx.operator.name)
        if s is None:
            return
        for judged in results:
            point = dict(judged.candidate.params)
            if judged.outcome.correct and judged.speedup:
                s.observed.append((point, math.log(judged.speedup)))
            elif not judged.outcome.correct:
                s.observed.append((point, FAILED))

    def usage(self) -> dict[str, Any]:
        searches = self.searches.values()
        return {
            "proposals": sum(s.proposals for s in searches),
            "explorations": sum(s.explored for s in searches),
            "observations": sum(len(s.observed) for s in searches),
            "prior_values": sum(len(s.prior) for s in searches),
        }

    def _candidate(self, base: Candidate, point: dict, explore: list[str] | None = None) -> Candidate:
        changed = {k: v for k, v in point.items() if base.params.get(k) != v}
        idea = "tune " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "declared defaults"
        if explore:
            idea = f"explore ({', '.join(explore)} lost before): {idea}"
        return Candidate(base.source, base.filename, base.toolchain, dict(point), idea, self.name, base.hash)

    def _untried(self, ctx: Context, base: Candidate, point: dict) -> bool:
        cand = self._candidate(base, point)
        return cand.hash not in self.proposed and cand.hash != base.hash and not ctx.seen(cand.hash)

    def _pool(self, space: TuningSpace) -> list[dict]:
        if space.size() <= POOL:
            return list(space.points())
        names = list(space.axes)
        pool = []
        for _ in range(POOL * 3):
            point = {n: self.rng.choice(space.axes[n]) for n in names}
            if space.allows(point):
                pool.append(point)
            if len(pool) >= POOL:
                break
        return pool

    def _effects(self, s: _Search) -> tuple[dict[tuple[str, Any], float], dict[tuple[str, Any], int]]:
        total: dict[tuple[str, Any], float] = defaultdict(float)
        count: dict[tuple[str, Any], int] = defaultdict(int)
        mean = sum(y for _, y in s.observed) / len(s.observed) if s.observed else 0.0
        for point, y in s.observed:
            for key in point.items():
                total[key] += y - mean
                count[key] += 1
        effects = {k: (total[k] + s.prior.get(k, 0.0)) / (count[k] + 1) for k in set(total) | set(s.prior)}
        return effects, count

    def _score(self, s: _Search, point: dict) -> float:
        key = (len(s.observed), len(s.prior))
        if s.cache_key != key:
            s.cache, s.cache_key = self._effects(s), key
        effects, count = s.cache
        n = len(s.observed) + 1
        value = sum(effects.get(kv, 0.0) for kv in point.items())
        bonus = sum(math.sqrt(math.log(n + 1) / (count.get(kv, 0) + 1)) for kv in point.items())
        return value + self.ucb * bonus / max(1, len(point))
