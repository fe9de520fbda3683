"""A budget is a cap, not a quota: the stop rules, the run's time budget, and a tuner that does not
spend evaluations on values the experience graph already knows lose (real SQLite graph)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pytest_kope.agents.base import Context, OperatorInfo
from pytest_kope.agents.tuner.agent import Tuner
from pytest_kope.candidate import Candidate
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.memory import Graph, distill, recall_from
from pytest_kope.memory.recall import RecallQuery
from pytest_kope.spec import parse_spec
from pytest_kope.stopping import RunClock, Stop, StopRule

HW = {"arch": "x86_64", "model": "AMD EPYC", "simd": ["avx2", "avx512f"], "cores": 2, "compiler": "gcc 12"}
OTHER_HW = {**HW, "model": "Intel Xeon"}
SRC = """\
// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// kope: param THREADS = 1 | 2
// kope: param VEC = 0 | 8 | 16
void rowsum(const float *x, float *y, int rows, int cols) {}
"""


# -- the stop rule and the clock -----------------------------------------------------------------------


def test_patience_stops_after_n_successive_evaluations_without_a_gain() -> None:
    rule = StopRule(budget=24, patience=3)
    assert rule.room(4) == 3  # never more than patience allows: the rule stops at exactly N
    rule.record([False, False], 1.0)
    assert rule.room(4) == 1
    rule.record([True], 1.0)  # a gain starts the count again
    assert rule.room(4) == 3
    rule.record([False, False, False], 1.0)
    assert rule.room(4) == 0 and rule.evaluations == 6
    assert rule.why == {
        "reason": "no_gain",
        "short": "no gain in 3",
        "detail": "no gain in the last 3 evaluations (--kope-patience 3)",
    }


def test_the_budget_caps_and_patience_zero_never_stops() -> None:
    rule = StopRule(budget=5, patience=0)
    assert rule.room(4) == 4
    rule.record([False] * 4, 1.0)
    assert rule.room(4) == 1
    rule.record([False], 1.0)
    assert rule.room(4) == 0 and rule.why is not None
    assert rule.why["reason"] == "budget" and rule.why["short"] == "budget spent"
    rule.stop(Stop.ERROR, "a later reason")  # the first reason stands
    assert rule.why is not None and rule.why["reason"] == "budget"


def test_the_time_budget_is_shared_and_leaves_time_to_verify() -> None:
    t = [0.0]
    clock = RunClock(minutes=2, now=lambda: t[0])  # 120 s for 4 operators
    slot = clock.slot(operators_left=4, batch=4)  # nothing measured yet: the first one starts on a guess
    assert slot is not None and slot.deadline == pytest.approx(15 + 4 * 15 + 22.5)  # at least one round
    t[0] = 10.0
    clock.baselines.append(10.0)  # its baseline took 10 s: a verification ~15 s, an evaluation ~10 s
    rule = StopRule(budget=24, patience=0, slot=slot)
    assert rule.room(4) == 4
    rule.record([False] * 4, 20.0)  # 5 s per evaluation
    t[0] = 30.0
    assert rule.room(4) == 4
    t[0] = 75.0  # (97.5 - 75 - 15) / 5: one more fits
    assert rule.room(4) == 1
    t[0] = 90.0
    assert rule.room(4) == 0 and rule.why is not None and rule.why["reason"] == "time"
    assert clock.can_verify()  # verifying may use the rest of the run's time
    late = StopRule(budget=24, patience=0, slot=slot)  # an operator whose baseline used up its share
    assert late.room(4) == 3  # still gets its first round from the run's time: (120 - 90 - 15) / 5
    late.record([False], 5.0)
    assert late.room(4) == 0 and late.why is not None and late.why["reason"] == "time"
    t[0] = 100.0  # 20 s left: less than a baseline, a round and a verification (10 + 20 + 15)
    assert clock.slot(operators_left=3, batch=4) is None
    t[0] = 110.0
    assert not clock.can_verify()


def test_a_long_time_budget_gives_each_operator_an_equal_share() -> None:
    t = [0.0]
    clock = RunClock(minutes=20, now=lambda: t[0])
    clock.baselines.append(10.0)
    first = clock.slot(operators_left=4, batch=4)
    assert first is not None and first.deadline == pytest.approx(300.0)
    t[0] = 100.0  # the first stopped early: the others share what it left
    second = clock.slot(operators_left=3, batch=4)
    assert second is not None and second.deadline == pytest.approx(100 + 1100 / 3)
    assert RunClock(minutes=0, now=lambda: 0.0).slot(1, 4) is None


# -- the tuner and the lessons -------------------------------------------------------------------------


def judged(params, speedup=None, parent=None, agent="tuner", outcome=Outcome.OK) -> Judged:
    cand = Candidate(SRC, "rowsum.c", "c", dict(params), idea="", agent=agent, parent=parent)
    timings = [Timing("t", 1e-3, 1e-3 / speedup, speedup, speedup, speedup, 9)] if speedup else []
    return Judged(cand, outcome, timings=timings, speedup=speedup)


@pytest.fixture
def graph(tmp_path):
    g = Graph(tmp_path / "experience.db")
    yield g
    g.close()


def teach(graph: Graph, operator: str, family: str, hw: dict[str, Any], slower: dict[str, int]) -> Judged:
    """Record a baseline and two tries that change `slower` (with different VEC) and were 2x slower."""
    task = graph.task_id(operator, family, "c", hw)
    base = judged({"THREADS": 1, "VEC": 0}, 1.0, agent="baseline")
    graph.record(task, "r0", base)
    for vec in (8, 16):
        graph.record(task, "r0", judged({**slower, "VEC": vec}, 0.5, parent=base.candidate.hash))
    distill(graph, task, "r0")
    return base


def context(
    graph: Graph, operator: str = "rowsum", family: str = "rowwise", hw: dict[str, Any] = HW
) -> Context:
    spec = parse_spec(SRC, "rowsum.c")
    task = graph.task_id(operator, family, "c", hw)
    base = Judged(
        Candidate(SRC, "rowsum.c", "c", dict(spec.space.defaults), "committed kernel", "baseline"),
        Outcome.OK,
        speedup=1.0,
    )
    info = OperatorInfo(operator, family, "c", "rowsum.c", SRC, spec.space, spec.kernels)

    def recall(state: str = "", budget: int = 12, points: bool = False):
        return recall_from(
            graph, RecallQuery(operator, family, hw, "c", state, max_items=budget, points=points)
        )

    return Context(info, hw, base, base, [], 24, recall, lambda h: graph.lookup(task, h) is not None)


def test_a_value_lessons_mark_losing_is_still_tried_but_ranked_last_by_the_graph(graph) -> None:
    base = teach(graph, "rowsum", "rowwise", HW, {"THREADS": 2})
    task = graph.task_id("rowsum", "rowwise", "c", HW)
    graph.record(task, "r0", judged({"THREADS": 1, "VEC": 8}, 1.0, parent=base.candidate.hash))
    distill(graph, task, "r0")  # VEC=8 alone changes nothing: the loss was THREADS=2's
    (lesson,) = [r for r in graph.lessons() if r["key"] == "THREADS=2"]
    assert lesson["uses"] == 2 and lesson["wins"] == 0 and "against THREADS=1" in lesson["text"]
    assert lesson["text"].startswith("THREADS=2: 0.5")
    tuner, ctx = Tuner(seed=1, explore_rate=0.0), context(graph)
    first = tuner.propose(ctx, 1)
    assert first[0].params == {"THREADS": 1, "VEC": 16}  # the graph arm goes first, believing the lesson
    proposed = first + tuner.propose(ctx, 10)
    # never left untried because a lesson said so: the last untried point is proposed too
    assert sorted((c.params["THREADS"], c.params["VEC"]) for c in proposed) == [(1, 16), (2, 0)]
    assert tuner.propose(ctx, 4) == [] and tuner.done == "tried every point of the tuning space"
    assert tuner.untried("rowsum") == []


def test_the_bandit_turns_to_exploring_when_graph_led_proposals_stop_winning(graph) -> None:
    teach(graph, "rowsum", "rowwise", HW, {"THREADS": 2})
    tuner, ctx = Tuner(seed=1, explore_rate=0.0), context(graph)
    tuner.propose(ctx, 1)
    s = tuner.searches["rowsum"]
    before = [tuner._arm(s) for _ in range(400)].count("explore")
    for i in range(6):  # six graph-led proposals in a row that did not beat the incumbent
        cand = Candidate(SRC, "rowsum.c", "c", {"THREADS": 1, "VEC": 8}, idea=str(i), agent="tuner")
        s.arm_of[cand.hash] = "graph"
        tuner.observe(ctx, [Judged(cand, Outcome.OK, speedup=1.0)])
    after = [tuner._arm(s) for _ in range(400)].count("explore")
    assert before < 150 and after > 250


@pytest.mark.parametrize(
    "operator, family, hw, closeness",
    [
        ("rowsum", "rowwise", HW, 1.0),  # this operator on this machine, in an earlier run
        ("layernorm", "rowwise", HW, 0.5),  # same family, same hardware
        ("gelu", "elementwise", HW, 0.25),  # another family
        ("rowsum", "rowwise", OTHER_HW, 0.5),  # another machine of the same arch
    ],
)
def test_a_source_weighs_by_its_closeness_before_any_verdict(graph, operator, family, hw, closeness) -> None:
    teach(graph, operator, family, hw, {"THREADS": 2})
    tuner = Tuner(seed=1)
    tuner.propose(context(graph), 1)
    (weight,) = tuner.source_weights("rowsum").values()
    assert weight == pytest.approx(closeness)


def test_a_source_that_ranks_this_operators_points_wrongly_loses_its_weight(graph) -> None:
    teach(graph, "layernorm", "rowwise", HW, {"THREADS": 2})  # layernorm: THREADS=2 is 2x slower
    tuner, ctx = Tuner(seed=1, explore_rate=0.0), context(graph)
    proposed = tuner.propose(ctx, 4)
    # here THREADS=2 is what helps: the opposite of what the source says
    tuner.observe(ctx, [judged(c.params, 3.0 if c.params["THREADS"] == 2 else 1.1) for c in proposed])
    tuner.propose(ctx, 1)  # refits: the source's predictions are compared with the verdicts
    (weight,) = tuner.source_weights("rowsum").values()
    assert weight < 0.5 * 0.5  # from its closeness 0.5 down by more than half


def counted(recall: Callable[..., Any], name: str, calls: list[tuple[str, str]]) -> Callable[..., Any]:
    """`recall`, noting each call's (operator, state) in `calls`."""

    def noted(state: str = "", budget: int = 12) -> Any:
        calls.append((name, state))
        return recall(state, budget)

    return noted


def test_each_operator_gets_its_own_search(graph) -> None:
    calls: list[tuple[str, str]] = []
    tuner = Tuner(seed=1, explore_rate=0.0)
    for name in ("rowsum", "rmsnorm"):
        ctx = context(graph, operator=name)
        ctx.recall = counted(ctx.recall, name, calls)
        first = tuner.propose(ctx, 2)
        tuner.observe(ctx, [Judged(c, Outcome.OK, speedup=1.0) for c in first])
    started = [c for c in calls if c[1] == "no kernel yet"]
    assert [n for n, _ in started] == ["rowsum", "rmsnorm"]  # each operator recalled its own priors
    # each search: the committed kernel and its own two verdicts
    assert {n: len(s.observed) for n, s in tuner.searches.items()} == {"rowsum": 3, "rmsnorm": 3}
