"""The `kope` command: stats, trajectories, lessons, export and import, and its errors."""

from __future__ import annotations

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.cli import main
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.memory import Graph, distill

HW = {"arch": "x86_64", "model": "AMD EPYC 7B13", "simd": ["avx2"], "cores": 2, "compiler": "gcc 12.2"}
SRC = "// kope: param BLOCK = 8 | 16\nvoid softmax(const float *x, float *y, int r, int c) {}\n"


def judged(params, outcome=Outcome.OK, speedup=None, parent=None, agent="tuner", idea="", **kw):
    cand = Candidate(SRC, "softmax.c", "c", dict(params), idea=idea, agent=agent, parent=parent)
    timings = (
        [Timing("test_perf", 1e-3, 1e-3 / speedup, speedup, speedup * 0.97, speedup * 1.03, 15)]
        if speedup
        else []
    )
    return Judged(cand, outcome, timings=timings, speedup=speedup, **kw)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / ".kope" / "experience.db"
    with Graph(path) as g:
        t = g.task_id("softmax", "rowwise", "c", HW)
        base = judged({"BLOCK": 8}, speedup=1.0, agent="baseline", idea="committed kernel")
        g.record(t, "r1", base)
        child = judged({"BLOCK": 16}, Outcome.BETTER, speedup=1.5, parent=base.candidate.hash)
        g.record(t, "r1", child)
        g.record(
            t,
            "r1",
            judged(
                {"BLOCK": 32},
                Outcome.INCORRECT,
                parent=child.candidate.hash,
                failures=["test_softmax: mismatch"],
            ),
        )
        g.record(t, "r1", judged({"BLOCK": 4}, Outcome.OK, speedup=0.9, parent=base.candidate.hash))
        distill(g, t, "r1")
        g.task_id("gemm", "matmul", "c", HW)
    return path


def test_graph_stats_counts_tables_and_outcomes(db, capsys):
    assert main(["--db", str(db), "graph", "stats"]) == 0
    out = capsys.readouterr().out
    assert str(db) in out
    assert [line.split() for line in out.splitlines() if line.startswith(("attempts ", "incorrect "))] == [
        ["attempts", "4"],
        ["incorrect", "1"],
    ]


def test_graph_show_prints_the_trajectory_as_a_tree(db, capsys):
    assert main(["graph", "show", "softmax", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("softmax [c] on AMD EPYC 7B13 avx2: 4 attempts (* committed")
    depth = {tuple(line.split()[1:3]): len(line) - len(line.lstrip(" *+")) for line in lines[1:]}
    assert depth == {
        ("baseline", "ok"): 3,
        ("tuner", "better"): 5,
        ("tuner", "incorrect"): 7,
        ("tuner", "ok"): 5,
    }
    best = next(line for line in lines if "better" in line)
    assert best.lstrip().startswith("+") and "speedup 1.50x" in best and "ratio 1.50" in best
    assert "committed kernel" in lines[1]
    # the kernel a reviewer merges is the one starred, fastest or not
    with Graph(db) as g:
        (task,) = g.tasks("softmax")
        slower = next(a for a in g.attempts(task["id"]) if a["outcome"] == "ok" and a["agent"] == "tuner")
        g.mark_committed(task["id"], slower["candidate_hash"], "kope/softmax", "abc1234")
    assert main(["graph", "show", "softmax", "--db", str(db)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if " ok " in line and "tuner" in line).lstrip().startswith("*")
    assert next(line for line in lines if "better" in line).lstrip().startswith("+")


def test_lessons_filter_and_limit(db, capsys):
    assert main(["--db", str(db), "lessons", "--operator", "softmax", "--limit", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["value", "uses", "wins", "fails", "effect"]
    body = out[2:]
    assert (
        len(body) == 2 and "BLOCK=16: 1.48x +-25% on softmax" in body[0]
    )  # the fitted effect, shrunk a little
    assert main(["--db", str(db), "lessons", "--operator", "gemm"]) == 0
    assert capsys.readouterr().out.strip() == "no lessons yet about gemm"


def test_export_then_import_round_trips(db, tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    assert main(["--db", str(db), "export", str(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    fresh = tmp_path / "fresh" / "experience.db"
    assert main(["--db", str(fresh), "import", str(out)]) == 0
    assert "4 attempts" in capsys.readouterr().out
    assert main(["--db", str(fresh), "import", str(out)]) == 0
    assert "nothing new" in capsys.readouterr().out
    with Graph(db) as a, Graph(fresh) as b:
        assert a.stats()["tables"] == b.stats()["tables"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["graph", "stats"], "no experience graph at {missing}; run `pytest --kope-optimize` first"),
        (["graph", "show", "softmax"], "no experience graph at {missing}"),
        (["export", "x.jsonl"], "no experience graph at {missing}"),
    ],
)
def test_a_missing_graph_is_one_clear_line_and_exit_2(tmp_path, capsys, argv, message):
    missing = tmp_path / "nowhere" / "experience.db"
    assert main(["--db", str(missing), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kope: " + message.format(missing=missing))
    assert not missing.exists()


def test_other_errors_name_the_file_and_exit_2(db, tmp_path, capsys):
    assert main(["--db", str(db), "graph", "show", "nosuchop"]) == 2
    assert "known operators: gemm, softmax" in capsys.readouterr().err
    assert main(["--db", str(db), "import", str(tmp_path / "none.jsonl")]) == 2
    assert f"cannot read {tmp_path / 'none.jsonl'}" in capsys.readouterr().err
    junk = tmp_path / "junk.db"
    junk.write_text("this is not sqlite" * 100)
    assert main(["--db", str(junk), "graph", "stats"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kope: {junk} is damaged (file is not a database)") and err.count("\n") == 1


def test_default_db_is_under_the_current_folder(db, monkeypatch, capsys):
    monkeypatch.chdir(db.parent.parent)
    assert main(["graph", "stats"]) == 0
    assert "experience graph .kope/experience.db" in capsys.readouterr().out
