"""The offline agent: searches the tuning space a kernel declares, no key needed.

Strategy: model-guided search. A main-effects model (each axis value's mean effect on log speedup,
shrunk towards zero) is fitted to every verdict so far, with the experience graph's recalled lessons
as prior pseudo-observations; the next batch is the unseen points with the best upper confidence
bound. Recalled exemplar points from similar operators and hardware go first.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from typing import Any

from ..candidate import Candidate
from ..judge.outcome import Judged
from ..spec import TuningSpace, parse_spec
from .base import Context

FAILED = -1.0  # log-speedup charged to a point that broke correctness or did not build
POOL = 4000  # points scored per round when the space is larger than this


class Tuner:
    name = "tuner"

    def __init__(self, seed: int = 0, explore: float = 0.3, recall_items: int = 12):
        self.rng = random.Random(seed)
        self.explore = explore
        self.recall_items = recall_items
        self.observed: list[tuple[dict, float]] = []
        self.prior: dict[tuple[str, Any], float] = {}
        self.queue: list[dict] = []
        self.proposed: set[str] = set()
        self.started = False

    def _base(self, ctx: Context) -> tuple[Candidate, TuningSpace]:
        """Tune the incumbent's own space when it declares one (an LLM may add knobs), else the committed."""
        inc = ctx.incumbent.candidate
        own = parse_spec(inc.source, inc.filename).space
        if own.axes:
            return inc, own
        return ctx.baseline.candidate, ctx.operator.space

    def _start(self, ctx: Context, space: TuningSpace) -> None:
        self.started = True
        best = ctx.incumbent.speedup or 1.0
        state = "no kernel yet" if not ctx.history else f"correct at {best:.2f}x of baseline"
        recall = ctx.recall(state=state, budget=self.recall_items)
        for name, value, weight in getattr(recall, "preferred_params", lambda: [])():
            if name in space.axes and value in space.axes[name]:
                self.prior[(name, value)] = self.prior.get((name, value), 0.0) + weight
        for seed in getattr(recall, "seeds", lambda: [])():
            point = {
                **space.defaults,
                **{k: v for k, v in seed.items() if k in space.axes and v in space.axes[k]},
            }
            if point != space.defaults and space.allows(point):
                self.queue.append(point)

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        base, space = self._base(ctx)
        if not space.axes:
            return []
        if not self.started:
            self._start(ctx, space)
        chosen: list[dict] = []
        while self.queue and len(chosen) < n:
            point = self.queue.pop(0)
            if self._fresh(ctx, base, point, chosen):
                chosen.append(point)
        if len(chosen) < n:
            scored = sorted(
                ((self._score(p), self.rng.random(), p) for p in self._pool(space)),
                key=lambda t: (t[0], t[1]),
                reverse=True,
            )
            for _, _, point in scored:
                if len(chosen) >= n:
                    break
                if self._fresh(ctx, base, point, chosen):
                    chosen.append(point)
        out = []
        for point in chosen:
            cand = self._candidate(base, point, ctx)
            self.proposed.add(cand.hash)
            out.append(cand)
        return out

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        for judged in results:
            point = dict(judged.candidate.params)
            if judged.outcome.correct and judged.speedup:
                self.observed.append((point, math.log(judged.speedup)))
            elif not judged.outcome.correct:
                self.observed.append((point, FAILED))

    def usage(self) -> dict[str, Any]:
        return {"observations": len(self.observed), "prior_values": len(self.prior)}

    def _candidate(self, base: Candidate, point: dict, ctx: Context) -> Candidate:
        changed = {k: v for k, v in point.items() if base.params.get(k) != v}
        idea = "tune " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "declared defaults"
        return Candidate(base.source, base.filename, base.toolchain, dict(point), idea, self.name, base.hash)

    def _fresh(self, ctx: Context, base: Candidate, point: dict, chosen: list[dict]) -> bool:
        if point in chosen:
            return False
        cand = self._candidate(base, point, ctx)
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

    def _effects(self) -> tuple[dict[tuple[str, Any], float], dict[tuple[str, Any], int]]:
        total: dict[tuple[str, Any], float] = defaultdict(float)
        count: dict[tuple[str, Any], int] = defaultdict(int)
        mean = sum(y for _, y in self.observed) / len(self.observed) if self.observed else 0.0
        for point, y in self.observed:
            for key in point.items():
                total[key] += y - mean
                count[key] += 1
        effects = {
            k: (total[k] + self.prior.get(k, 0.0)) / (count[k] + 1) for k in set(total) | set(self.prior)
        }
        return effects, count

    def _score(self, point: dict) -> float:
        effects, count = self._effects_cached()
        n = len(self.observed) + 1
        value = sum(effects.get(kv, 0.0) for kv in point.items())
        bonus = sum(math.sqrt(math.log(n + 1) / (count.get(kv, 0) + 1)) for kv in point.items())
        return value + self.explore * bonus / max(1, len(point))

    def _effects_cached(self):
        key = (len(self.observed), len(self.prior))
        if getattr(self, "_cache_key", None) != key:
            self._cache = self._effects()
            self._cache_key = key
        return self._cache
