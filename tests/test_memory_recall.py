"""Recall: ranked by structure x value x relevance, deduplicated, and always within its budget."""

from __future__ import annotations

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.hardware import fingerprint_id
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.memory import Graph, RecallQuery, distill, recall_from
from pytest_kope.memory.recall import tokens

HW_A = {"arch": "x86_64", "model": "AMD EPYC 7B13", "simd": ["avx2"], "cores": 2, "compiler": "gcc 12.2"}
HW_B = {
    "arch": "x86_64",
    "model": "Intel Xeon 8375C",
    "simd": ["avx512f"],
    "cores": 8,
    "compiler": "gcc 12.2",
}
HW_C = {"arch": "aarch64", "model": "Neoverse-V1", "simd": ["sve"], "cores": 8, "compiler": "gcc 12.2"}
SRC = "// kope: param BLOCK = 8 | 16\nvoid kernel(const float *x, float *y, int r, int c) { /* body */ }\n"


def judged(params, outcome=Outcome.OK, speedup=None, parent=None, agent="tuner", idea="", source=SRC, **kw):
    cand = Candidate(source, "k.c", "c", dict(params), idea=idea, agent=agent, parent=parent)
    timings = (
        [Timing("test_perf", 1e-3, 1e-3 / speedup, speedup, speedup * 0.97, speedup * 1.03, 15)]
        if speedup
        else []
    )
    return Judged(cand, outcome, timings=timings, speedup=speedup, **kw)


def teach(graph, operator, family, hw, params, speedup=1.5, outcome=Outcome.BETTER, run="r1", **kw):
    """Record a baseline and one child changing `params`, distill; returns the task id."""
    t = graph.task_id(operator, family, "c", hw)
    base = judged({"BLOCK": 8, "VEC": 4}, speedup=1.0, agent="baseline")
    graph.record(t, "r0", base)
    child = judged(
        {"BLOCK": 8, "VEC": 4, **params},
        outcome,
        speedup=speedup if outcome.correct else None,
        parent=base.candidate.hash,
        **kw,
    )
    graph.record(t, run, child)
    distill(graph, t, run)
    return t


@pytest.fixture
def graph(tmp_path):
    g = Graph(tmp_path / "experience.db")
    yield g
    g.close()


def keys(recall):
    return [lesson.key for lesson in recall.lessons]


def test_same_operator_ranks_above_same_family_above_other(graph):
    teach(graph, "gemm", "matmul", HW_A, {"BLOCK": 64})
    teach(graph, "logsoftmax", "rowwise", HW_A, {"BLOCK": 32})
    teach(graph, "softmax", "rowwise", HW_A, {"BLOCK": 16})
    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    assert keys(r) == ["BLOCK=16", "BLOCK=32", "BLOCK=64"]
    assert [lesson.scope for lesson in r.lessons] == [
        "operator/hardware",
        "family/hardware",
        "other/hardware",
    ]
    assert r.lessons[0].score > r.lessons[1].score > r.lessons[2].score


def test_same_hardware_ranks_above_same_arch_above_other(graph):
    teach(graph, "softmax", "rowwise", HW_C, {"BLOCK": 64})
    teach(graph, "softmax", "rowwise", HW_B, {"BLOCK": 32})
    teach(graph, "softmax", "rowwise", HW_A, {"BLOCK": 16})
    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    assert keys(r) == ["BLOCK=16", "BLOCK=32", "BLOCK=64"]
    assert [lesson.scope.split("/")[1] for lesson in r.lessons] == ["hardware", "arch", "other"]


def test_value_orders_lessons_of_equal_structure_and_preferred_params_are_signed(graph):
    teach(graph, "softmax", "rowwise", HW_A, {"VEC": 16}, outcome=Outcome.INCORRECT, failures=["t: wrong"])
    teach(graph, "softmax", "rowwise", HW_A, {"BLOCK": 16})
    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    assert keys(r) == ["BLOCK=16", "VEC=16"]
    prefs = r.preferred_params()
    assert prefs[0][:2] == ("BLOCK", 16) and prefs[0][2] > 0
    assert prefs[-1][:2] == ("VEC", 16) and prefs[-1][2] < 0


def test_the_same_key_in_one_family_is_recalled_once_from_the_closest_scope(graph):
    teach(graph, "logsoftmax", "rowwise", HW_A, {"BLOCK": 16})
    teach(graph, "softmax", "rowwise", HW_B, {"BLOCK": 16})
    teach(graph, "softmax", "rowwise", HW_A, {"BLOCK": 16})
    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    assert keys(r) == ["BLOCK=16"]
    assert r.lessons[0].scope == "operator/hardware"
    assert graph.db["lessons"].count == 3


def test_the_state_text_lifts_relevant_lessons(graph):
    teach(
        graph,
        "softmax",
        "rowwise",
        HW_A,
        {"BLOCK": 16},
        agent="claude",
        idea="Unroll the exp loop by 4",
        source=SRC + "// a\n",
    )
    teach(
        graph,
        "softmax",
        "rowwise",
        HW_A,
        {"BLOCK": 16},
        agent="claude",
        idea="Use aligned loads for rows",
        source=SRC + "// b\n",
        run="r2",
    )
    plain = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    ideas = [lesson for lesson in plain.lessons if lesson.kind == "idea"]
    assert ideas[0].key == "use aligned loads for rows"  # the newer, at equal score
    lifted = recall_from(
        graph, RecallQuery("softmax", "rowwise", HW_A, "c", state="correct at 1.5x; exp loop dominates")
    )
    ideas = [lesson for lesson in lifted.lessons if lesson.kind == "idea"]
    assert ideas[0].key == "unroll the exp loop by 4"
    assert ideas[0].score > ideas[1].score


def test_exemplars_seeds_fixes_and_sources_only_within_a_token_budget(graph):
    t = teach(graph, "softmax", "rowwise", HW_A, {"BLOCK": 16}, speedup=1.8)
    broken = judged({"BLOCK": 32}, Outcome.INCORRECT, failures=["test_softmax[64x8192]: rel err 0.5"])
    graph.record(t, "r3", broken)
    fixed = judged(
        {"BLOCK": 32},
        Outcome.BETTER,
        speedup=2.5,
        parent=broken.candidate.hash,
        agent="claude",
        idea="Handle the row tail separately",
        source=SRC + "// tail\n",
    )
    graph.record(t, "r3", fixed)
    teach(graph, "gemm", "matmul", HW_A, {"TILE": 8}, speedup=9.0)

    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    assert r.seeds()[0] == {"BLOCK": 32} and {"BLOCK": 8, "VEC": 4, "TILE": 8} not in r.seeds()[:2]
    assert r.seeds()[1] == {"BLOCK": 8, "VEC": 4, **{"BLOCK": 16}}
    kinds = {ex["kind"] for ex in r.exemplars}
    assert kinds == {"best", "failure", "fix"}
    fix = next(ex for ex in r.exemplars if ex["kind"] == "fix")
    assert fix["fixed_from"]["hash"] == broken.candidate.hash and "rel err" in fix["fixed_from"]["failure"]
    assert all(ex["source"] is None for ex in r.exemplars)  # no token budget: no sources

    roomy = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c", max_tokens=2000))
    assert any(ex["source"] for ex in roomy.exemplars)
    assert "Handle the row tail separately" in roomy.render(2000)
    tight = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c", max_tokens=60))
    assert all(ex["source"] is None for ex in tight.exemplars)
    assert tokens(tight.render(60)) <= 60


def test_failure_state_finds_instructive_failures_by_text(graph):
    teach(
        graph,
        "softmax",
        "rowwise",
        HW_A,
        {"BLOCK": 64},
        outcome=Outcome.CRASHED,
        failures=["test_softmax[3x5]: killed by SIGSEGV in the tail loop"],
    )
    teach(
        graph,
        "logsoftmax",
        "rowwise",
        HW_B,
        {"VEC": 32},
        outcome=Outcome.INCORRECT,
        failures=["test_logsoftmax: NaN in output"],
    )
    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c", state="failing with SIGSEGV"))
    failures = [ex for ex in r.exemplars if ex["kind"] == "failure"]
    assert failures and "SIGSEGV" in failures[0]["failure"]
    assert all("NaN" not in ex["failure"] for ex in failures)


def test_mark_used_records_the_lessons_handed_out(graph):
    teach(graph, "softmax", "rowwise", HW_A, {"BLOCK": 16})
    r = recall_from(graph, RecallQuery("softmax", "rowwise", HW_A, "c"))
    graph.mark_used("r9", "softmax", [lesson.id for lesson in r.lessons])
    graph.mark_used("r9", "softmax", [lesson.id for lesson in r.lessons])
    edges = graph.rows("SELECT * FROM edges WHERE rel = 'used_in_context'")
    assert [(e["src_id"], e["dst_id"], e["note"]) for e in edges] == [(str(r.lessons[0].id), "r9", "softmax")]
    assert graph.one("SELECT handed_out FROM lesson_summary")["handed_out"] == 1


def test_budget_holds_in_a_graph_of_5000_lessons(graph):
    operators = [(f"op{i}", f"fam{i % 7}") for i in range(50)]
    hws = [fingerprint_id(HW_A), fingerprint_id(HW_B), fingerprint_id(HW_C)]
    rows = []
    for n in range(5000):
        op, fam = operators[n % 50]
        hw = hws[n % 3]
        rows.append(
            {
                "text": f"P{n % 40}={n}: {1 + n % 9 / 10:.2f}x on {op} ({fam}, machine {hw}) after a long story "
                * 2,
                "kind": "param",
                "key": f"P{n % 40}={n}",
                "operator": op,
                "family": fam,
                "toolchain": "c",
                "hardware_id": hw,
                "arch": "aarch64" if hw == hws[2] else "x86_64",
                "effect": 1 + n % 9 / 10,
                "value": (n % 13 + 1) / 15,
                "uses": n % 5,
                "wins": 0,
                "fails": 0,
                "data": f'{{"param": "P{n % 40}", "value": {n}}}',
            }
        )
    with graph.db.atomic():
        graph.db["lessons"].insert_all(rows)
    teach(graph, "op3", "fam3", HW_A, {"BLOCK": 16}, speedup=3.0)

    counted = recall_from(
        graph, RecallQuery("op3", "fam3", HW_A, "c", state="failing with mismatch in the tail", max_items=12)
    )
    budgeted = recall_from(
        graph, RecallQuery("op3", "fam3", HW_A, "c", state="correct at 3x", max_tokens=400)
    )
    assert len(counted.lessons) == 12 and len(counted.exemplars) <= 12 and len(counted.seeds()) <= 12
    assert counted.lessons[0].scope == "operator/hardware"
    assert sum(tokens(lesson.line()) + 1 for lesson in budgeted.lessons) <= 400
    for budget in (0, 10, 100, 400, 4000):
        assert tokens(budgeted.render(budget)) <= budget
