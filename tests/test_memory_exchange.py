"""Export to JSON Lines and merge-by-content import."""

from __future__ import annotations

import json

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.errors import KopeError
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.memory import Graph, RecallQuery, distill, export_jsonl, import_jsonl, recall_from

HW = {"arch": "x86_64", "model": "AMD EPYC 7B13", "simd": ["avx2"], "cores": 2, "compiler": "gcc 12.2"}
HW2 = {"arch": "aarch64", "model": "Neoverse-V1", "simd": ["sve"], "cores": 8, "compiler": "gcc 12.2"}
SRC = "// kope: param BLOCK = 8 | 16\nvoid softmax(const float *x, float *y, int r, int c) {}\n"
TABLES = ("hardware", "tasks", "sources", "runs", "attempts", "observations", "lessons", "edges", "llm_calls")


def judged(params, outcome=Outcome.OK, speedup=None, parent=None, agent="tuner", idea="", source=SRC, **kw):
    cand = Candidate(source, "softmax.c", "c", dict(params), idea=idea, agent=agent, parent=parent)
    timings = (
        [Timing("test_perf", 1e-3, 1e-3 / speedup, speedup, speedup * 0.97, speedup * 1.03, 15)]
        if speedup
        else []
    )
    return Judged(cand, outcome, timings=timings, speedup=speedup, **kw)


def populate(graph, hw=HW, run="r1"):
    graph.start_run(run, "claude", hw)
    for op in ("softmax", "transpose"):
        t = graph.task_id(op, "rowwise" if op == "softmax" else "layout", "c", hw)
        base = judged({"BLOCK": 8}, speedup=1.0, agent="baseline", build_log="gcc ok")
        graph.record(t, run, base)
        child = judged({"BLOCK": 16}, Outcome.BETTER, speedup=1.6, parent=base.candidate.hash)
        graph.record(t, run, child)
        graph.record(
            t,
            run,
            judged(
                {"BLOCK": 32},
                Outcome.INCORRECT,
                parent=child.candidate.hash,
                failures=["test_x: mismatch"],
                notes=["n"],
            ),
        )
        graph.record(
            t,
            run,
            judged(
                {"BLOCK": 16},
                Outcome.BETTER,
                speedup=2.0,
                parent=child.candidate.hash,
                agent="claude",
                idea="Blocked loop",
                source=SRC + "// v\n",
            ),
        )
        distill(graph, t, run)
        graph.record_llm_call(run, op, "claude-x", {"input_tokens": 10, "output_tokens": 3})
        recalled = recall_from(graph, RecallQuery(op, "", hw, "c"))
        graph.mark_used(run, op, [lesson.id for lesson in recalled.lessons])
    graph.finish_run(run, {"calls": 2})


def counts(graph):
    return {t: graph.db[t].count for t in TABLES}


@pytest.fixture
def graphs(tmp_path):
    opened = [Graph(tmp_path / f"g{i}.db") for i in range(2)]
    yield opened
    for g in opened:
        g.close()


def test_export_then_import_into_an_empty_graph_gives_equal_counts(graphs, tmp_path):
    src, dst = graphs
    populate(src)
    path = tmp_path / "out" / "experience.jsonl"
    n = export_jsonl(src, path)
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["type"] == "kope-export" and len(lines) == n + 1
    added = import_jsonl(dst, path)
    assert counts(dst) == counts(src)
    assert added["attempts"] == 8 and added["lessons"] == src.db["lessons"].count
    assert import_jsonl(dst, path) == {}  # importing twice adds nothing
    assert counts(dst) == counts(src)
    rels = "SELECT rel, count(*) FROM edges GROUP BY rel ORDER BY rel"
    assert dst.db.execute(rels).fetchall() == src.db.execute(rels).fetchall()
    t = dst.task_id("softmax", "rowwise", "c", HW)
    assert dst.best(t)["speedup"] == 2.0 and dst.best(t)["source"] == SRC + "// v\n"


def test_import_merges_by_content_keeping_the_lesson_with_more_evidence(graphs, tmp_path):
    a, b = graphs
    populate(a)
    populate(b, hw=HW2, run="r2")
    export_jsonl(a, tmp_path / "a.jsonl")
    t = a.task_id("softmax", "rowwise", "c", HW)
    base = a.lookup(t, a.attempts(t)[0]["candidate_hash"])
    a.record(
        t, "r3", judged({"BLOCK": 16, "X": 1}, Outcome.BETTER, speedup=1.7, parent=base["candidate_hash"])
    )
    distill(a, t, "r3")  # BLOCK=16 on softmax has more evidence in a than in a.jsonl
    import_jsonl(b, tmp_path / "a.jsonl")
    export_jsonl(b, tmp_path / "b.jsonl")
    added = import_jsonl(a, tmp_path / "b.jsonl")
    assert added["attempts"] == 8 and added["hardware"] == 1 and "lessons_updated" not in added
    lesson = a.one(
        "SELECT * FROM lessons WHERE key = 'BLOCK=16' AND operator = 'softmax' AND arch = 'x86_64'"
    )
    assert lesson["uses"] == 2
    assert a.db["attempts"].count == 17 and a.db["hardware"].count == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json\n", "g.jsonl:1: not JSON"),
        ('{"type": "attempt"}\n', "first line is not a kope export header"),
        ('{"type": "kope-export", "version": 99}\n', "newer than this pytest-kope reads"),
        (
            '{"type": "kope-export", "version": 1}\n{"type": "attempt", "task": ["a"]}\n',
            "g.jsonl:2: bad attempt",
        ),
    ],
)
def test_a_bad_file_is_refused_with_its_name_and_line(graphs, tmp_path, text, message):
    path = tmp_path / "g.jsonl"
    path.write_text(text)
    with pytest.raises(KopeError, match=message):
        import_jsonl(graphs[0], path)
    assert graphs[0].db["tasks"].count == 0  # all or nothing
