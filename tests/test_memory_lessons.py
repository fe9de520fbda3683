"""Distilling lessons from child-vs-parent comparisons, and the value that learns from later outcomes."""

from __future__ import annotations

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.memory import Graph, distill

HW = {"arch": "x86_64", "model": "AMD EPYC 7B13", "simd": ["avx2"], "cores": 2, "compiler": "gcc 12.2"}
SRC = "// kope: param BLOCK = 8 | 16\nvoid softmax(const float *x, float *y, int r, int c) {}\n"


def judged(params, outcome=Outcome.OK, speedup=None, parent=None, agent="tuner", idea="", source=SRC, **kw):
    cand = Candidate(source, "softmax.c", "c", dict(params), idea=idea, agent=agent, parent=parent)
    timings = (
        [Timing("test_perf", 1e-3, 1e-3 / speedup, speedup, speedup * 0.97, speedup * 1.03, 15)]
        if speedup
        else []
    )
    return Judged(cand, outcome, timings=timings, speedup=speedup, **kw)


@pytest.fixture
def graph(tmp_path):
    g = Graph(tmp_path / "experience.db")
    yield g
    g.close()


@pytest.fixture
def task(graph):
    t = graph.task_id("softmax", "rowwise", "c", HW)
    graph.record(t, "r0", judged({"BLOCK": 8, "UNROLL": 1, "flags": "-O2"}, speedup=1.0, agent="baseline"))
    return t


def baseline(graph, t):
    return graph.one("SELECT candidate_hash FROM attempts WHERE task_id = ? AND agent = 'baseline'", (t,))[
        "candidate_hash"
    ]


def test_tuner_lessons_name_the_value_operator_family_hardware_and_effect(graph, task):
    parent = baseline(graph, task)
    graph.record(
        task,
        "r1",
        judged(
            {"BLOCK": 8, "UNROLL": 1, "flags": "-O3 -march=native"},
            Outcome.BETTER,
            speedup=3.1,
            parent=parent,
        ),
    )
    graph.record(
        task,
        "r1",
        judged(
            {"BLOCK": 8, "UNROLL": 4, "flags": "-O2"},
            Outcome.INCORRECT,
            parent=parent,
            failures=["test_softmax[64x8192]: max rel err 0.4"],
        ),
    )
    ids = distill(graph, task, "r1")
    assert len(ids) == 2
    texts = {r["key"]: r["text"] for r in graph.lessons()}
    # the effect is the fitted model's (against the default value, shrunk a little by its prior),
    # with its spread and counts: not the whole jump's ratio
    assert texts["flags=-O3 -march=native"] == (
        "flags=-O3 -march=native: 2.97x +-27% on softmax (rowwise, AMD EPYC 7B13 avx2)"
        " (against flags=-O2, fitted over 2 attempts of the family here, 1 with it)"
    )
    assert texts["UNROLL=4"] == "UNROLL=4 broke correctness on softmax (rowwise, AMD EPYC 7B13 avx2)"
    best, broken = graph.lessons()
    assert best["value"] > 0.5 > broken["value"]
    edges = graph.rows("SELECT rel, dst_kind FROM edges WHERE src_kind = 'lesson'")
    assert {(e["rel"], e["dst_kind"]) for e in edges} == {("learned_from", "attempt"), ("about", "task")}


def test_an_llm_lesson_is_its_idea_plus_the_measured_effect(graph, task):
    parent = baseline(graph, task)
    idea = "Vectorize the row max and sum with AVX2, one pass for exp"
    graph.record(
        task,
        "r1",
        judged(
            {"BLOCK": 8, "UNROLL": 1, "flags": "-O2"},
            Outcome.BETTER,
            speedup=2.0,
            parent=parent,
            agent="claude",
            idea=idea,
            source=SRC + "// v2\n",
        ),
    )
    graph.record(
        task,
        "r1",
        judged(
            {"BLOCK": 8, "UNROLL": 1, "flags": "-O2"},
            Outcome.CRASHED,
            parent=parent,
            agent="claude",
            idea="Prefetch with threads",
            source=SRC + "// v3\n",
            failures=["test_softmax: killed by SIGSEGV"],
        ),
    )
    distill(graph, task, "r1")
    texts = sorted(r["text"] for r in graph.lessons() if r["kind"] == "idea")
    assert texts == [
        "Prefetch with threads crashed on softmax (rowwise, AMD EPYC 7B13 avx2): test_softmax: killed by SIGSEGV",
        f"{idea}: 2.00x on softmax (rowwise, AMD EPYC 7B13 avx2)",
    ]
    # and one lesson per technique, keyed by tag; the failed technique keeps its reason
    techniques = {r["key"]: r["text"] for r in graph.lessons() if r["kind"] == "technique"}
    assert set(techniques) == {"simd", "fused-passes", "threads", "prefetch"}
    assert techniques["fused-passes"] == (
        f'technique fused-passes: 2.00x on softmax (rowwise, AMD EPYC 7B13 avx2) (e.g. "{idea}")'
    )
    assert techniques["prefetch"] == (
        "technique prefetch crashed on softmax (rowwise, AMD EPYC 7B13 avx2): test_softmax: killed by SIGSEGV"
        ' (e.g. "Prefetch with threads")'
    )


def test_a_repeated_observation_updates_its_lesson_and_distill_is_per_round(graph, task):
    base = baseline(graph, task)
    p2 = judged({"BLOCK": 8, "UNROLL": 2, "flags": "-O2"}, Outcome.OK, speedup=1.0, parent=base)
    graph.record(task, "r1", p2)
    graph.record(
        task,
        "r1",
        judged({"BLOCK": 16, "UNROLL": 1, "flags": "-O2"}, Outcome.BETTER, speedup=1.5, parent=base),
    )
    distill(graph, task, "r1")
    assert distill(graph, task, "r1") == []  # each attempt teaches once
    graph.record(
        task,
        "r2",
        judged(
            {"BLOCK": 16, "UNROLL": 2, "flags": "-O2"}, Outcome.BETTER, speedup=1.2, parent=p2.candidate.hash
        ),
    )
    distill(graph, task, "r2")
    rows = graph.rows("SELECT * FROM lessons WHERE key = 'BLOCK=16'")
    assert len(rows) == 1
    (row,) = rows
    assert (row["uses"], row["wins"], row["fails"]) == (2, 2, 0)
    # the model's estimate of BLOCK=16 against BLOCK=8 over the four attempts (balanced here, so near
    # the geometric mean of the two gains, shrunk a little by the prior)
    assert row["effect"] == pytest.approx((1.5 * 1.2) ** 0.5, rel=0.02)
    assert "fitted over 4 attempts of the family here, 2 with it" in row["text"]


def test_value_rises_for_a_helping_lesson_and_decays_for_a_misleading_one(graph, task):
    """Round after round, BLOCK=16 keeps winning while VEC=8 won once, then kept losing."""
    base = baseline(graph, task)
    history: dict[str, list[float]] = {"BLOCK=16": [], "VEC=8": []}
    for round_ in range(4):
        run = f"r{round_}"
        parent = judged(
            {"BLOCK": 8, "UNROLL": round_ + 10, "VEC": 4, "flags": "-O2"},
            Outcome.OK,
            speedup=1.0,
            parent=base,
        )
        graph.record(task, run, parent)
        p = parent.candidate.hash
        graph.record(
            task,
            run,
            judged(
                {"BLOCK": 16, "UNROLL": round_ + 10, "VEC": 4, "flags": "-O2"},
                Outcome.BETTER,
                speedup=1.3,
                parent=p,
            ),
        )
        if round_ == 0:
            graph.record(
                task,
                run,
                judged(
                    {"BLOCK": 8, "UNROLL": round_ + 10, "VEC": 8, "flags": "-O2"},
                    Outcome.BETTER,
                    speedup=1.4,
                    parent=p,
                ),
            )
        else:
            graph.record(
                task,
                run,
                judged(
                    {"BLOCK": 8, "UNROLL": round_ + 10, "VEC": 8, "flags": "-O2"},
                    Outcome.OK,
                    speedup=0.8,
                    parent=p,
                ),
            )
        distill(graph, task, run)
        for key in history:
            history[key].append(graph.one("SELECT value FROM lessons WHERE key = ?", (key,))["value"])
    helping, misleading = history["BLOCK=16"], history["VEC=8"]
    assert helping == sorted(helping) and helping[-1] > helping[0]
    assert misleading == sorted(misleading, reverse=True) and misleading[-1] < 0.5 < misleading[0]
    vec = graph.one("SELECT * FROM lessons WHERE key = 'VEC=8'")
    assert "1 of 4 tries helped" in vec["text"]


def test_screened_and_suspect_attempts_teach_nothing(graph, task):
    base = baseline(graph, task)
    graph.record(
        task, "r1", judged({"BLOCK": 32}, Outcome.REJECTED, parent=base, failures=["screen: uses fork"])
    )
    graph.record(task, "r1", judged({"BLOCK": 64}, Outcome.SUSPECT, speedup=400.0, parent=base))
    assert distill(graph, task, "r1") == []
    assert graph.db["attempts"].count_where("distilled = 1") == 2
