"""Transfer with doubt: the experience graph moves the tuner's prior, this operator's verdicts decide.

Small additive tables searched through the real SQLite graph (no compiler, no timing): a source that
ranks this operator's verdicts wrongly loses its weight within two verdicts, a value the graph does
not know is tried before what the graph ranks, and several sources that agree on wrong advice cost
warm no more than one evaluation over cold (median).
"""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

import pytest

from pytest_kope.agents.tuner.agent import Tuner
from pytest_kope.agents.tuner.search import Memory, Table, TableEvaluator, evaluations_to, run_search
from pytest_kope.judge.outcome import Judged
from pytest_kope.memory import Graph
from pytest_kope.memory.effects import Observation
from pytest_kope.memory.transfer import fit_source, graph_prior, measure_agreement

HW = {"arch": "x86_64", "model": "AMD EPYC", "simd": ["avx2"], "cores": 2, "compiler": "gcc 12"}


def table(operator: str, family: str, axes: dict[str, list[int]], effects: dict[str, float]) -> Table:
    """A table over `axes` (first value the default) whose log speedup is additive in `effects`."""
    header = "// kope: kernel void k(const float *x, float *y, int n)\n" + "".join(
        f"// kope: param {n} = {' | '.join(map(str, vs))}\n" for n, vs in axes.items()
    )
    points = []
    for i, values in enumerate(itertools.product(*axes.values())):
        params = dict(zip(axes, values))
        y = sum(effects.get(f"{k}={v}", 0.0) for k, v in params.items()) + 0.01 * ((i * 7) % 5 - 2)
        points.append({"params": params, "outcome": "ok", "ratio": math.exp(y)})
    points[0]["ratio"] = 1.0  # the all-defaults point is the committed kernel
    data = {"operator": operator, "family": family, "header": header, "hardware": HW, "points": points}
    return Table.from_json(data)


def search(
    t: Table, seed: int, graph: Graph | None = None, budget: int | None = None
) -> tuple[Tuner, list[Judged]]:
    tuner = Tuner(seed=seed)
    run = f"{t.operator}-{seed}"
    memory = Memory(graph, run) if graph is not None else None
    history = run_search(tuner, t.info(), HW, TableEvaluator(t), budget or len(t.rows), memory)
    return tuner, history


def warm_graph(path: Path, sources: list[Table], seed: int, fill: int = 16) -> Graph:
    """A graph holding a `fill`-evaluation cold search of each source table."""
    graph = Graph(path)
    for t in sources:
        search(t, seed, graph, fill)
    return graph


AXES = {"VEC": [0, 8, 16], "THREADS": [1, 2], "UNROLL": [1, 4]}


def test_a_source_that_ranks_the_first_verdicts_wrongly_drops_to_nothing_within_two() -> None:
    """The weight comes from the first verdict on: two verdicts that contradict a source (three pairs
    with the committed kernel) take it from full trust to none; agreeing ones keep it."""
    says = {"VEC=0": 0.0, "VEC=8": 0.5, "VEC=16": 1.0}
    rows = [Observation({"VEC": v, "THREADS": 1, "UNROLL": 1}, says[f"VEC={v}"]) for v in (0, 8, 16)]
    wrong = fit_source("a", 0.5, rows, AXES, {})
    right = fit_source("b", 0.5, rows, AXES, {})
    one_of_three = 0.5 * (0.5 + 0.5 / 3)  # closeness, shrunk for knowing one of the three axes
    assert wrong is not None and right is not None and wrong.weight == pytest.approx(one_of_three)
    base = {"VEC": 0, "THREADS": 1, "UNROLL": 1}
    contradicting = [(base, 0.0), ({**base, "VEC": 8}, -0.3), ({**base, "VEC": 16}, -0.6)]
    measure_agreement([wrong], contradicting)
    assert (wrong.concordant, wrong.discordant, wrong.weight) == (0, 3, 0.0)
    measure_agreement([right], [(p, -y) for p, y in contradicting])
    assert right.weight == pytest.approx(one_of_three)
    # and a distrusted source no longer moves the prior
    assert graph_prior([wrong], {"VEC=8": 0.1}, AXES) == {"VEC=8": 0.1}


def test_a_source_weighs_less_the_fewer_axes_it_shares_and_after_its_pick_lost() -> None:
    says = {"VEC=8": 0.5, "VEC=16": 1.0, "THREADS=2": -0.3, "UNROLL=4": 0.2}
    points = [dict(zip(AXES, p)) for p in itertools.product(*AXES.values())]
    rows = [Observation(p, sum(says.get(f"{k}={v}", 0.0) for k, v in p.items())) for p in points]
    every = fit_source("all", 0.5, rows, AXES, {})
    vec_only = fit_source(
        "vec", 0.5, [r for r in rows if r.point["THREADS"] == 1 and r.point["UNROLL"] == 1], AXES, {}
    )
    assert every is not None and vec_only is not None
    assert every.weight == pytest.approx(0.5) and vec_only.weight < every.weight
    base = {"VEC": 0, "THREADS": 1, "UNROLL": 1}
    assert every.predicted_a_win({**base, "VEC": 16}, base)
    assert not every.predicted_a_win({**base, "THREADS": 2}, base)
    every.lost += 1  # its pick lost head to head, too close to make a pair: believed less anyway
    assert every.weight == pytest.approx(0.5 * (2 - 1) / (2 + 1))  # (PRIOR_PAIRS - 1) / (PRIOR_PAIRS + 1)


def test_a_value_the_graph_never_saw_is_tried_before_what_it_ranks(tmp_path) -> None:
    """The sibling's space has no FAST knob; on the target FAST=1 is what matters. The graph's first
    proposal must try it (what the graph does not know is no evidence against it) and warm must reach
    the best no later than cold."""
    sibling = table("sib", "rowwise", AXES, {"VEC=16": 1.0, "VEC=8": 0.6, "THREADS=2": -0.3})
    fast = {"FAST": [0, 1], **AXES}
    target = table("target", "rowwise", fast, {"FAST=1": 1.5, "VEC=16": 1.0, "VEC=8": 0.6, "THREADS=2": -0.3})
    warm, cold = [], []
    for seed in range(8):
        graph = warm_graph(tmp_path / f"g{seed}.db", [sibling], seed)
        try:
            tuner, history = search(target, seed + 100, graph)
        finally:
            graph.close()
        assert history[0].candidate.params["FAST"] == 1, seed
        assert tuner.usage()["graph_led"] > 0
        warm_at = evaluations_to(history, 0.95 * target.best())
        cold_at = evaluations_to(search(target, seed + 100)[1], 0.95 * target.best())
        assert warm_at is not None and cold_at is not None, seed  # both reach 95% of the best
        warm.append(warm_at)
        cold.append(cold_at)
    assert statistics.median(warm) <= statistics.median(cold), (warm, cold)


def test_a_budget_that_only_just_covers_the_space_tries_every_value_even_when_the_graph_leads(
    tmp_path,
) -> None:
    """The graph arm steps one new value at a time; when the budget left is what covering the untried
    values takes, it tries as many a point as the explore arm does, so nothing is left untried."""
    wide = {"VEC": [0, 8, 16, 32], "THREADS": [1, 2, 4], "UNROLL": [1, 4]}
    effects = {"VEC=16": 1.0, "VEC=8": 0.6, "VEC=32": 0.2, "THREADS=2": -0.3, "THREADS=4": -0.5}
    sibling, target = table("sib", "rowwise", wide, effects), table("target", "rowwise", wide, effects)
    for seed in range(6):
        graph = warm_graph(tmp_path / f"g{seed}.db", [sibling], seed)
        try:
            tuner, history = search(target, seed + 100, graph, budget=3)
        finally:
            graph.close()
        assert tuner.usage()["graph_led"] > 0 and len(history) == 3
        assert tuner.untried("target") == [], seed


def test_sources_that_agree_on_wrong_advice_cost_warm_at_most_one_evaluation(tmp_path) -> None:
    """Three sources of another family agree that THREADS=2 and UNROLL=4 win; on the target both lose
    and VEC=16 alone wins. The target's own verdicts must overrule them quickly."""
    wrong = {"THREADS=2": 1.0, "UNROLL=4": 0.8, "VEC=8": 0.3, "VEC=16": -0.2}
    sources = [table(f"other{i}", "elementwise", AXES, wrong) for i in range(3)]
    target = table(
        "target", "rowwise", AXES, {"VEC=16": 1.2, "VEC=8": 0.5, "THREADS=2": -0.6, "UNROLL=4": -0.5}
    )
    warm, cold = [], []
    for seed in range(8):
        graph = warm_graph(tmp_path / f"g{seed}.db", sources, seed, fill=8)
        try:
            history = search(target, seed + 100, graph)[1]
        finally:
            graph.close()
        warm.append(evaluations_to(history, 0.95 * target.best()) or len(target.rows) + 1)
        cold.append(
            evaluations_to(search(target, seed + 100)[1], 0.95 * target.best()) or len(target.rows) + 1
        )
    assert statistics.median(warm) <= statistics.median(cold) + 1, (warm, cold)
    assert max(warm) <= len(target.rows) // 2, warm


def test_a_table_ranks_its_points_by_their_own_time_not_by_the_baselines_noise() -> None:
    """Every point is timed against the same committed kernel; a slow one (sgemm's 1.5 s) gave one
    point ratios of 47x to 87x. The table divides one pooled committed time by each point's own."""
    header = "// kope: kernel void k(const float *x, float *y, int n)\n// kope: param B = 0 | 1 | 2\n"
    points = [  # (committed seconds the point's pairing saw) / (its own seconds) = its ratio
        {"params": {"B": 0}, "outcome": "ok", "ratio": 1.0, "seconds": 1.5},
        {"params": {"B": 1}, "outcome": "ok", "ratio": 1.8 / 0.020, "seconds": 0.020},  # a slow baseline
        {"params": {"B": 2}, "outcome": "ok", "ratio": 1.2 / 0.018, "seconds": 0.018},  # a fast one
    ]
    data = {"operator": "k", "family": "f", "header": header, "hardware": HW, "points": points}
    t = Table.from_json(data)
    b2, b1 = t.speedup({"B": 2}), t.speedup({"B": 1})
    assert b2 is not None and b1 is not None and b2 > b1  # 18 ms beats 20 ms, whatever its pairing saw
    assert t.speedup({"B": 1}) == pytest.approx(1.5 / 0.020)  # the median committed time, 1.5 s
    assert t.speedup({"B": 0}) == pytest.approx(1.0)
    del points[2]["seconds"]  # a row without its own time: ratios as measured
    assert Table.from_json(data).speedup({"B": 1}) == pytest.approx(90.0)
