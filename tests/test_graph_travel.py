"""The experience graph between CI runs: a cached file is whole once checkpointed, and the graphs of a
job matrix over operators (each job starting from the same cached graph) merge cleanly by export and
import, in either order."""

from __future__ import annotations

import shutil
from pathlib import Path

from test_memory_exchange import HW, TABLES, counts, judged, populate

from pytest_kope.judge.outcome import Outcome
from pytest_kope.memory import Graph, distill, export_jsonl, import_jsonl


def test_a_checkpointed_graph_file_is_whole_without_its_wal(tmp_path: Path) -> None:
    graph = Graph(tmp_path / "experience.db")
    populate(graph)
    assert graph.checkpoint()
    assert (
        not (tmp_path / "experience.db-wal").exists() or (tmp_path / "experience.db-wal").stat().st_size == 0
    )
    shutil.copy(tmp_path / "experience.db", tmp_path / "cached.db")  # what a CI cache saves: the file alone
    before = counts(graph)
    graph.close()
    with Graph(tmp_path / "cached.db") as cached:
        assert counts(cached) == before and before["attempts"] == 8


def job(cache: Path, folder: Path, run: str, operator: str) -> Path:
    """One matrix job: restore the cache, tune one operator, export."""
    folder.mkdir()
    shutil.copy(cache, folder / "experience.db")
    with Graph(folder / "experience.db") as graph:
        graph.start_run(run, "tuner", HW)
        family = "rowwise" if operator == "softmax" else "layout"
        task = graph.task_id(operator, family, "c", HW)
        best = graph.best(task)
        assert best is not None
        parent = best["candidate_hash"]
        graph.record(task, run, judged({"BLOCK": 64}, Outcome.BETTER, speedup=2.5, parent=parent))
        distill(graph, task, run)
        graph.finish_run(run, {})
        export_jsonl(graph, folder / "graph.jsonl")
    return folder / "graph.jsonl"


def test_a_job_matrix_over_operators_merges_cleanly_in_either_order(tmp_path: Path) -> None:
    with Graph(tmp_path / "cache.db") as first:
        populate(first)
        start = counts(first)
    exports = [
        job(tmp_path / "cache.db", tmp_path / "a", "run-a", "softmax"),
        job(tmp_path / "cache.db", tmp_path / "b", "run-b", "transpose"),
    ]
    merged: list[dict[str, int]] = []
    for order in (exports, exports[::-1]):
        target = tmp_path / f"merged-{len(merged)}.db"
        shutil.copy(tmp_path / "cache.db", target)
        with Graph(target) as graph:
            for path in order:
                import_jsonl(graph, path)
            assert all(import_jsonl(graph, path) == {} for path in order)  # again: nothing new
            merged.append(counts(graph))
            assert {r["id"] for r in graph.rows("SELECT id FROM runs")} >= {"r1", "run-a", "run-b"}
            for operator, family in (("softmax", "rowwise"), ("transpose", "layout")):
                best = graph.best(graph.task_id(operator, family, "c", HW))
                assert best is not None
                assert best["speedup"] == 2.5 and best["run_id"] == (
                    "run-a" if operator == "softmax" else "run-b"
                )
            dupes = "SELECT count(*) FROM (SELECT task_id, candidate_hash FROM attempts GROUP BY 1, 2 HAVING count(*) > 1)"
            assert graph.db.execute(dupes).fetchone()[0] == 0
    assert merged[0] == merged[1]
    assert merged[0]["attempts"] == start["attempts"] + 2
    assert set(merged[0]) == set(TABLES)
