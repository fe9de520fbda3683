"""The experience graph's storage: schema and migrations, recording, lookup, and surviving kill -9."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

import pytest_kope
from pytest_kope.candidate import Candidate
from pytest_kope.hardware import fingerprint_id
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.memory import Graph
from pytest_kope.memory.schema import migrations

HW = {"arch": "x86_64", "model": "AMD EPYC 7B13", "simd": ["avx2", "fma"], "cores": 2, "compiler": "gcc 12.2"}
SRC = "// kope: param BLOCK = 8 | 16\nvoid softmax(const float *x, float *y, int r, int c) {}\n"


def judged(params, outcome=Outcome.OK, ratio=None, speedup=None, parent=None, agent="tuner", idea="", **kw):
    source = kw.pop("source", SRC)
    cand = Candidate(source, "softmax.c", "c", dict(params), idea=idea, agent=agent, parent=parent)
    timings = (
        [Timing("test_perf[64x8192]", 1e-3, 1e-3 / ratio, ratio, ratio * 0.95, ratio * 1.05, 15)]
        if ratio
        else []
    )
    return Judged(cand, outcome, timings=timings, speedup=speedup, **kw)


@pytest.fixture
def graph(tmp_path):
    g = Graph(tmp_path / "deep" / ".kope" / "experience.db")
    yield g
    g.close()


def test_open_creates_parent_folder_wal_views_and_fts(tmp_path):
    path = tmp_path / "a" / "b" / "experience.db"
    with Graph(path) as g:
        assert path.is_file()
        assert g.db.journal_mode == "wal"
        assert {"attempt_summary", "best_per_task", "lesson_summary", "run_usage"} <= set(g.db.view_names())
        assert {"lessons_fts", "observations_fts"} <= set(g.db.table_names())
        names = ["m001_core", "m002_llm_usage", "m003_views", "m004_ceilings"]
        assert [m.name for m in migrations.applied(g.db)] == names
    with Graph(path) as g:  # reopening applies nothing twice
        assert len(migrations.applied(g.db)) == 4


def test_an_older_database_is_migrated_keeping_its_rows(tmp_path):
    path = tmp_path / "old.db"
    old = Database(path)
    migrations.apply(old, stop_before="m002_llm_usage")  # the schema as the first release wrote it
    assert "llm_calls" not in old.table_names()
    old.table("hardware").insert({"id": "abc", "arch": "x86_64"})
    old.table("tasks").insert(
        {"operator": "softmax", "family": "rowwise", "toolchain": "c", "hardware_id": "abc"}
    )
    old.table("runs").insert({"id": "r0", "agent": "tuner", "tokens_in": 5})
    old.table("sources").insert({"hash": "s1", "text": SRC, "size": len(SRC)})
    old.table("attempts").insert(
        {
            "task_id": 1,
            "candidate_hash": "h1",
            "source_hash": "s1",
            "params": '{"BLOCK": 8}',
            "run_id": "r0",
            "outcome": "ok",
            "speedup": 1.0,
            "agent": "baseline",
        }
    )
    old.close()

    with Graph(path) as g:
        names = ["m001_core", "m002_llm_usage", "m003_views", "m004_ceilings"]
        assert [m.name for m in migrations.applied(g.db)] == names
        assert "tokens_cache_read" in g.db["runs"].columns_dict
        attempt = g.lookup(1, "h1")
        assert attempt is not None and attempt["params"] == {"BLOCK": 8}
        g.record_llm_call("r0", "softmax", "claude-test", {"input_tokens": 10, "output_tokens": 2})
        g.finish_run("r0", {})
        run = g.one("SELECT * FROM runs WHERE id = 'r0'")
        assert run is not None and (run["tokens_in"], run["tokens_out"]) == (10, 2)
        summary = g.one("SELECT * FROM attempt_summary")
        assert summary is not None and summary["operator"] == "softmax"


def test_hardware_and_task_ids_are_upserts(graph):
    same = dict(reversed(list(HW.items())))
    assert graph.hardware_id(HW) == graph.hardware_id(same) == fingerprint_id(HW)
    assert graph.hardware_id(HW) != graph.hardware_id({**HW, "compiler": "gcc 13.1"})
    t = graph.task_id("softmax", "rowwise", "c", HW)
    assert graph.task_id("softmax", "", "c", same, shapes="64x8192 f32") == t
    assert graph.task(t)["family"] == "rowwise"  # an empty family does not erase the known one
    assert graph.task(t)["shapes"] == "64x8192 f32"
    assert graph.task_id("softmax", "rowwise", "triton", HW) != t
    assert graph.db["hardware"].count == 2


def test_record_is_whole_and_idempotent_and_lookup_finds_it(graph):
    t = graph.task_id("softmax", "rowwise", "c", HW)
    graph.start_run("r1", "tuner", HW)
    j = judged(
        {"BLOCK": 16},
        Outcome.INCORRECT,
        build_log="gcc -O2 ...\nok",
        failures=["test_softmax[64x8192]: max rel err 0.3", "test_softmax[3x5]: nan"],
        notes=["screened: ok"],
    )
    assert graph.lookup(t, j.candidate.hash) is None
    first = graph.record(t, "r1", j)
    counts = {name: graph.db[name].count for name in ("attempts", "observations", "edges", "sources")}
    assert graph.record(t, "r1", j) == first  # no attempt is judged twice
    assert {name: graph.db[name].count for name in counts} == counts

    found = graph.lookup(t, j.candidate.hash)
    assert found["outcome"] == "incorrect" and found["params"] == {"BLOCK": 16} and found["source"] == SRC
    kinds = [o["kind"] for o in graph.observations(first)]
    assert kinds == ["build_log", "test_failure", "test_failure", "note"]
    again = graph.judged(t, j.candidate.hash)
    assert (
        again.candidate == j.candidate and again.failures == j.failures and again.outcome is Outcome.INCORRECT
    )
    assert graph.lookup(t + 1, j.candidate.hash) is None


def test_a_stored_value_no_tuning_value_can_be_is_left_out_and_the_graph_still_reads(graph):
    """A plugin agent (or an older kope) may have stored a list as a param: the row still reads, its
    scalar values kept, and a recall over it does not fail."""
    from pytest_kope.memory import recall_from
    from pytest_kope.memory.recall import RecallQuery

    t = graph.task_id("softmax", "rowwise", "c", HW)
    graph.start_run("r1", "plugin", HW)
    odd = judged({"BLOCK": 16}, Outcome.OK, ratio=1.5, speedup=1.5)
    odd.candidate.params["SHAPE"] = [4, 4]  # what a typed agent cannot give
    graph.record(t, "r1", odd)
    found = graph.lookup(t, odd.candidate.hash)
    assert found is not None and found["params"] == {"BLOCK": 16}
    assert graph.judged(t, odd.candidate.hash).candidate.params == {"BLOCK": 16}
    got = recall_from(graph, RecallQuery("softmax", "rowwise", HW, "c", points=True))
    assert [p["params"] for p in got.points] == [{"BLOCK": 16}]


def test_crash_timing_and_edges(graph):
    t = graph.task_id("softmax", "rowwise", "c", HW)
    base = judged({"BLOCK": 8}, Outcome.OK, ratio=1.0, speedup=1.0, agent="baseline")
    child = judged(
        {"BLOCK": 16}, Outcome.CRASHED, parent=base.candidate.hash, failures=["test_softmax: SIGSEGV"]
    )
    child_id = graph.record(t, "r1", child)  # recorded before its parent: linked when the parent arrives
    base_id = graph.record(t, "r1", base)
    assert [o["kind"] for o in graph.observations(child_id)] == ["test_failure", "crash"]
    timing = graph.observations(base_id)[0]
    assert timing["kind"] == "timing" and timing["data"]["ratio"] == 1.0
    assert graph.judged(t, base.candidate.hash).timings == base.timings
    edges = graph.rows(
        "SELECT src_id, rel, dst_kind, dst_id FROM edges WHERE src_kind = 'attempt' ORDER BY id"
    )
    rels = {(e["src_id"], e["rel"], e["dst_kind"]) for e in edges}
    assert (str(child_id), "derived_from", "attempt") in rels
    assert (str(base_id), "evaluated_on", "hardware") in rels
    assert sum(e["rel"] == "observed" for e in edges) == 3


def test_best_is_the_fastest_correct_attempt(graph):
    t = graph.task_id("softmax", "rowwise", "c", HW)
    assert graph.best(t) is None
    graph.record(t, "r", judged({"BLOCK": 8}, Outcome.OK, ratio=1.0, speedup=1.0))
    graph.record(t, "r", judged({"BLOCK": 16}, Outcome.BETTER, ratio=1.5, speedup=1.5))
    graph.record(t, "r", judged({"BLOCK": 32}, Outcome.SUSPECT, ratio=90.0, speedup=90.0))
    graph.record(t, "r", judged({"BLOCK": 64}, Outcome.INCORRECT))
    best = graph.best(t)
    assert best["params"] == {"BLOCK": 16} and best["source"] == SRC
    assert graph.one("SELECT * FROM best_per_task")["speedup"] == 1.5


def test_the_incumbent_is_where_the_latest_search_ended_not_the_fastest_measured(graph):
    """A rerun resumes from the winner the judge kept, not from an attempt it found no better (noise)."""
    t = graph.task_id("softmax", "rowwise", "c", HW)
    assert graph.incumbent(t) is None
    graph.record(t, "r", judged({"BLOCK": 16}, Outcome.BETTER, ratio=2.4, speedup=2.4))
    graph.record(t, "r", judged({"BLOCK": 32}, Outcome.OK, ratio=1.03, speedup=2.49))
    assert graph.best(t)["params"] == {"BLOCK": 32}
    assert graph.incumbent(t)["params"] == {"BLOCK": 16} and graph.incumbent(t)["source"] == SRC
    graph.record(t, "r2", judged({"BLOCK": 8}, Outcome.BETTER, ratio=1.1, speedup=1.1))  # a later run
    assert graph.incumbent(t)["params"] == {"BLOCK": 8}


def test_runs_and_llm_calls_account_tokens(graph):
    graph.start_run("r2", "claude", HW)
    graph.record_llm_call(
        "r2",
        "softmax",
        "claude-x",
        {
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_read_input_tokens": 70,
            "cache_creation_input_tokens": 30,
        },
    )
    graph.record_llm_call("r2", "softmax", "claude-x", {"input_tokens": 50, "output_tokens": 5})
    graph.finish_run("r2", {"calls": 2})
    run = graph.one("SELECT * FROM run_usage WHERE id = 'r2'")
    assert (run["llm_calls"], run["input_tokens"], run["cache_read"], run["cache_write"]) == (2, 150, 70, 30)
    row = graph.one("SELECT * FROM runs WHERE id = 'r2'")
    assert (row["agent"], row["tokens_in"], row["tokens_out"]) == ("claude", 150, 25) and row["finished"]
    stats = graph.stats()
    assert stats["tables"]["llm_calls"] == 2 and stats["tables"]["runs"] == 1


WRITER = textwrap.dedent(
    """
    import sys
    from pytest_kope.candidate import Candidate
    from pytest_kope.judge.outcome import Judged, Outcome
    from pytest_kope.memory import Graph

    g = Graph(sys.argv[1])
    hw = {"arch": "x86_64", "model": "test"}
    t = g.task_id("softmax", "rowwise", "c", hw)
    i = 0
    while True:
        c = Candidate("void f(){}" + str(i), "softmax.c", "c", {"I": i}, agent="tuner")
        failures = [f"test_{k}: mismatch {'x' * 2000}" for k in range(20)]
        g.record(t, "run", Judged(c, Outcome.INCORRECT, failures=failures, build_log="log " * 5000))
        print(i, flush=True)
        i += 1
    """
)


def test_sigkill_mid_write_leaves_a_consistent_graph(tmp_path):
    path = tmp_path / "experience.db"
    root = Path(pytest_kope.__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, env=env, text=True
    )
    assert proc.stdout is not None  # stdout=PIPE
    try:
        for _ in range(25):  # let it write a while, then kill it at an arbitrary instant
            assert proc.stdout.readline(), "the writer died early"
        time.sleep(0.013)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    with Graph(path) as g:
        attempts = g.rows("SELECT id FROM attempts")
        assert len(attempts) >= 25
        for a in attempts:  # every attempt is whole: its 21 observations and 22 edges, or nothing
            assert g.db["observations"].count_where("attempt_id = ?", [a["id"]]) == 21
            assert g.db["edges"].count_where("src_kind = 'attempt' AND src_id = ?", [str(a["id"])]) == 22
        assert g.db["observations"].count == 21 * len(attempts)
        indexed = g.one("SELECT count(*) n FROM observations_fts")
        assert indexed is not None and indexed["n"] == 21 * len(attempts)
        t = g.task_id("softmax", "rowwise", "c", {"arch": "x86_64", "model": "test"})
        g.record(t, "resumed", judged({"BLOCK": 8}))  # the next run resumes on the same file
