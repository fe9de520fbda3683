"""Moving experience between graphs as JSON Lines (CI caches, sharing across machines).

Rows are merged by content, never by local id: hardware by fingerprint hash, tasks by (operator,
hardware, toolchain), sources by hash, runs by id, attempts by (task key, candidate hash) with their
observations, lessons by (kind, key, operator, toolchain, hardware) keeping the one with more evidence,
LLM calls by all their fields. So importing a file twice adds nothing, and exporting then importing
into an empty graph gives equal counts in every table. Edges are rebuilt from those keys.

The first line is a header: {"type": "kope-export", "version": 1, "migrations": [...]}.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import KopeError
from .rows import new_id, writing

if TYPE_CHECKING:
    from .graph import Graph

FORMAT = "kope-export"
VERSION = 1
TaskKey = tuple[str, str, str]  # operator, hardware_id, toolchain


def export_jsonl(graph: Graph, path: Path | str) -> int:
    """Write the whole graph to `path` (via a temporary file, then renamed); returns records written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as out:
        from .schema import migrations

        header = {
            "type": FORMAT,
            "version": VERSION,
            "migrations": [m.name for m in migrations.applied(graph.db)],
        }
        out.write(json.dumps(header) + "\n")
        for record in _records(graph):
            out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
            n += 1
    os.replace(tmp, path)
    return n


def _records(graph: Graph) -> Iterator[dict[str, Any]]:
    for table, kind in (("hardware", "hardware"), ("runs", "run"), ("sources", "source")):
        for row in graph.iter_rows(table):
            yield {"type": kind, **row}
    tasks: dict[int, TaskKey] = {}
    for row in graph.iter_rows("tasks", "id"):
        tasks[row["id"]] = (row["operator"], row["hardware_id"], row["toolchain"])
        yield {"type": "task", **{k: v for k, v in row.items() if k != "id"}}
    keys: dict[int, list[Any]] = {}
    for row in graph.iter_rows("attempts", "id"):
        task_key = tasks[row["task_id"]]
        keys[row["id"]] = [*task_key, row["candidate_hash"]]
        observations = [
            {"kind": o["kind"], "text": o["text"], "data": o["data"]}
            for o in graph.rows("SELECT * FROM observations WHERE attempt_id = ? ORDER BY id", (row["id"],))
        ]
        body = {k: v for k, v in row.items() if k not in ("id", "task_id")}
        yield {"type": "attempt", "task": list(task_key), **body, "observations": observations}
    for row in graph.iter_rows("lessons", "id"):
        edges = graph.rows(
            "SELECT rel, dst_id, note FROM edges WHERE src_kind = 'lesson' AND src_id = ?"
            " AND rel IN ('learned_from', 'used_in_context') ORDER BY id",
            (str(row["id"]),),
        )
        learned = [
            keys[int(e["dst_id"])] for e in edges if e["rel"] == "learned_from" and int(e["dst_id"]) in keys
        ]
        used = [[e["dst_id"], e["note"]] for e in edges if e["rel"] == "used_in_context"]
        body = {k: v for k, v in row.items() if k != "id"}
        yield {"type": "lesson", **body, "learned_from": learned, "used_in": used}
    for row in graph.iter_rows("llm_calls", "id"):
        yield {"type": "llm_call", **{k: v for k, v in row.items() if k != "id"}}


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as e:
        raise KopeError(f"cannot read {path}: {e.strerror}; pass a file written by `kope export`") from None
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise KopeError(
                    f"{path}:{lineno}: not JSON ({e.msg}); the file must be JSON Lines from `kope export`"
                ) from None
            if not isinstance(record, dict) or "type" not in record:
                raise KopeError(f"{path}:{lineno}: a record needs a 'type'; is this a `kope export` file?")
            if lineno == 1 and record.get("type") != FORMAT:
                raise KopeError(
                    f"{path}: first line is not a kope export header; write it with `kope export`"
                )
            if lineno == 1 and int(record.get("version", 0)) > VERSION:
                raise KopeError(
                    f"{path}: export format version {record['version']} is newer than this pytest-kope reads"
                    f" ({VERSION}); upgrade pytest-kope"
                )
            yield lineno, record


def import_jsonl(graph: Graph, path: Path | str) -> dict[str, int]:
    """Merge an export into this graph, in one transaction; returns counts of what was added."""
    path = Path(path)
    added: Counter[str] = Counter()
    merger = _Merger(graph, added)
    with writing(graph.db):
        for lineno, record in _lines(path):
            kind = record.pop("type")
            handler = getattr(merger, f"on_{kind.replace('-', '_')}", None)
            if handler is None:
                added["skipped"] += 1
                continue
            try:
                handler(record)
            except (LookupError, TypeError, ValueError, sqlite3.Error) as e:
                raise KopeError(
                    f"{path}:{lineno}: bad {kind} record ({e!r}); re-export with `kope export`"
                ) from None
        for task_id in merger.touched:
            graph.link_parents(task_id)
    return dict(added)


class _Merger:
    def __init__(self, graph: Graph, added: Counter[str]):
        self.graph, self.db, self.added = graph, graph.db, added
        self.touched: set[int] = set()
        self.task_ids: dict[TaskKey, int] = {}

    def on_kope_export(self, record: dict[str, Any]) -> None:
        pass

    def _insert_new(self, table: str, row: dict[str, Any], count_as: str) -> None:
        before = self.db.execute("SELECT total_changes()").fetchone()[0]
        self.db.table(table).insert(row, ignore=True)
        if self.db.execute("SELECT total_changes()").fetchone()[0] > before:
            self.added[count_as] += 1

    def on_hardware(self, record: dict[str, Any]) -> None:
        self._insert_new("hardware", record, "hardware")

    def on_run(self, record: dict[str, Any]) -> None:
        self._insert_new("runs", record, "runs")

    def on_source(self, record: dict[str, Any]) -> None:
        self._insert_new("sources", record, "sources")

    def task(self, key: TaskKey, record: dict[str, Any] | None = None) -> int:
        key = (key[0], key[1], key[2])
        if key in self.task_ids:
            return self.task_ids[key]
        row = self.db.execute(
            "SELECT id FROM tasks WHERE operator = ? AND hardware_id = ? AND toolchain = ?", key
        ).fetchone()
        if row is None:
            self.db.table("hardware").insert({"id": key[1]}, ignore=True)
            body = record or {"operator": key[0], "hardware_id": key[1], "toolchain": key[2]}
            task_id = new_id(self.db.table("tasks").insert(body))
            self.added["tasks"] += 1
        else:
            task_id = int(row[0])
        self.task_ids[key] = task_id
        return task_id

    def on_task(self, record: dict[str, Any]) -> None:
        self.task((record["operator"], record["hardware_id"], record["toolchain"]), record)

    def on_attempt(self, record: dict[str, Any]) -> None:
        operator, hardware_id, toolchain = record.pop("task")
        task_id = self.task((operator, hardware_id, toolchain))
        observations = record.pop("observations", [])
        exists = self.db.execute(
            "SELECT 1 FROM attempts WHERE task_id = ? AND candidate_hash = ?",
            (task_id, record["candidate_hash"]),
        ).fetchone()
        if exists:
            return
        if record.get("run_id"):
            self.db.table("runs").insert({"id": record["run_id"]}, ignore=True)
        attempt_id = new_id(self.db.table("attempts").insert({**record, "task_id": task_id}))
        self.added["attempts"] += 1
        for obs in observations:
            obs_id = new_id(self.db.table("observations").insert({**obs, "attempt_id": attempt_id}))
            self.graph.edge("attempt", attempt_id, "observed", "observation", obs_id)
            self.added["observations"] += 1
        hardware_id = self.db.execute("SELECT hardware_id FROM tasks WHERE id = ?", (task_id,)).fetchone()[0]
        self.graph.edge("attempt", attempt_id, "evaluated_on", "hardware", hardware_id)
        self.touched.add(task_id)

    def on_lesson(self, record: dict[str, Any]) -> None:
        learned = record.pop("learned_from", [])
        used = record.pop("used_in", [])
        scope = (
            record["kind"],
            record["key"],
            record["operator"],
            record["toolchain"],
            record["hardware_id"],
        )
        row = self.db.execute(
            "SELECT id, uses FROM lessons WHERE kind = ? AND key = ? AND operator = ? AND toolchain = ?"
            " AND hardware_id = ?",
            scope,
        ).fetchone()
        if row is None:
            lesson_id = new_id(self.db.table("lessons").insert(record))
            self.added["lessons"] += 1
        else:
            lesson_id = int(row[0])
            if (record.get("uses") or 0) > (row[1] or 0):  # the export saw more: take its estimate
                self.db.table("lessons").update(
                    lesson_id, {k: v for k, v in record.items() if k != "created"}
                )
                self.added["lessons_updated"] += 1
        task_ids = set()
        for operator, hardware_id, toolchain, candidate_hash in learned:
            task_id = self.task((operator, hardware_id, toolchain))
            task_ids.add(task_id)
            found = self.db.execute(
                "SELECT id FROM attempts WHERE task_id = ? AND candidate_hash = ?", (task_id, candidate_hash)
            ).fetchone()
            if found:
                self.graph.edge("lesson", lesson_id, "learned_from", "attempt", found[0])
        for task_id in task_ids:
            self.graph.edge("lesson", lesson_id, "about", "task", task_id)
        for run_id, operator in used:
            self.db.table("runs").insert({"id": run_id}, ignore=True)
            self.graph.edge("lesson", lesson_id, "used_in_context", "run", run_id, note=operator)

    def on_llm_call(self, record: dict[str, Any]) -> None:
        names = sorted(record)
        where = " AND ".join(f"[{n}] IS ?" for n in names)
        if self.db.execute(f"SELECT 1 FROM llm_calls WHERE {where}", [record[n] for n in names]).fetchone():
            return
        self.db.table("runs").insert({"id": record["run_id"]}, ignore=True)
        self.db.table("llm_calls").insert(record)
        self.added["llm_calls"] += 1
