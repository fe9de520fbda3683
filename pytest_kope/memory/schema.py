"""The experience graph's SQLite schema, as ordered sqlite-utils migrations.

Each migration runs in one transaction with the record of it having been applied, so a database is
always at some whole version; opening an old database applies what it lacks. Add a change as a new
function at the end, never by editing an applied one.

Tables (readable in Datasette or `sqlite-utils tables .kope/experience.db`):

- hardware: one row per fingerprint, id = short hash of it
- tasks: one per (operator, hardware, toolchain)
- sources: kernel source texts, by hash
- runs: one per optimize run; llm_calls: every LLM call, with its token usage
- attempts: one per judged candidate of a task (unique candidate_hash per task)
- observations: what judging saw (build_log, test_failure, timing, crash, screen, note)
- lessons: one sentence learned, scoped by operator, family, toolchain, hardware; value = P(it helps)
- ceilings: measured bandwidth per working-set size and FMA peak per hardware (JSON)
- edges: typed links between rows (derived_from, evaluated_on, observed, learned_from, about,
  used_in_context)
- views: attempt_summary, best_per_task, lesson_summary, run_usage
"""

from __future__ import annotations

import fcntl
import sqlite3
from pathlib import Path

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

migrations = Migrations("pytest_kope")

EDGE_RELATIONS = ("derived_from", "evaluated_on", "observed", "learned_from", "about", "used_in_context")


def open_database(path: Path | str) -> Database:
    """Open (creating) the database file in WAL mode and bring its schema up to date."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # usable from any thread: a controller optimizing operators concurrently serializes its calls
    # (`scheduler.OneAtATime`); SQLite itself is built thread-safe (serialized mode)
    db = Database(sqlite3.connect(str(path), check_same_thread=False))
    db.execute("PRAGMA busy_timeout = 10000")
    # Two runs opening one new graph at once: SQLite answers a write that upgrades a read lock with
    # "database is locked" at once, without waiting, so schema changes take turns behind a file lock.
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        db.enable_wal()
        migrations.apply(db)
    return db


@migrations()
def m001_core(db: Database) -> None:
    """Hardware, tasks, sources, runs, attempts, observations, lessons, edges, and FTS5 indexes."""
    _hardware_and_tasks(db)
    _runs_and_attempts(db)
    _observations(db)
    _lessons_and_edges(db)
    db.table("lessons").enable_fts(["text"], create_triggers=True, tokenize="porter")
    db.table("observations").enable_fts(["text"], create_triggers=True, tokenize="porter")


def _hardware_and_tasks(db: Database) -> None:
    db.table("hardware").create(
        {
            "id": str,
            "arch": str,
            "model": str,
            "simd": str,
            "cores": int,
            "compiler": str,
            "label": str,
            "fingerprint": str,
            "created": str,
        },
        pk="id",
    )
    db.table("tasks").create(
        {
            "id": int,
            "operator": str,
            "family": str,
            "toolchain": str,
            "shapes": str,
            "hardware_id": str,
            "created": str,
        },
        pk="id",
        not_null={"operator", "toolchain", "hardware_id"},
        foreign_keys=[("hardware_id", "hardware", "id")],
    )
    db.table("tasks").create_index(["operator", "hardware_id", "toolchain"], unique=True)


def _runs_and_attempts(db: Database) -> None:
    db.table("sources").create({"hash": str, "text": str, "size": int}, pk="hash")
    db.table("runs").create(
        {
            "id": str,
            "started": str,
            "finished": str,
            "agent": str,
            "hardware_id": str,
            "tokens_in": int,
            "tokens_out": int,
            "notes": str,
        },
        pk="id",
        foreign_keys=[("hardware_id", "hardware", "id")],
    )
    db.table("attempts").create(
        {
            "id": int,
            "task_id": int,
            "candidate_hash": str,
            "source_hash": str,
            "filename": str,
            "params": str,
            "toolchain": str,
            "agent": str,
            "idea": str,
            "parent_hash": str,
            "run_id": str,
            "outcome": str,
            "ratio": float,
            "ratio_low": float,
            "time_s": float,
            "speedup": float,
            "seconds": float,
            "tests_passed": str,
            "extra": str,
            "distilled": int,
            "created": str,
        },
        pk="id",
        not_null={"task_id", "candidate_hash", "outcome"},
        defaults={"distilled": 0},
        foreign_keys=[
            ("task_id", "tasks", "id"),
            ("source_hash", "sources", "hash"),
            ("run_id", "runs", "id"),
        ],
    )
    db.table("attempts").create_index(["task_id", "candidate_hash"], unique=True)
    db.table("attempts").create_index(["task_id", "outcome", "speedup"])
    db.table("attempts").create_index(["run_id", "distilled"])


def _observations(db: Database) -> None:
    db.table("observations").create(
        {"id": int, "attempt_id": int, "kind": str, "text": str, "data": str},
        pk="id",
        not_null={"attempt_id", "kind"},
        foreign_keys=[("attempt_id", "attempts", "id")],
    )
    db.table("observations").create_index(["attempt_id"])


def _lessons_and_edges(db: Database) -> None:
    db.table("lessons").create(
        {
            "id": int,
            "text": str,
            "kind": str,  # param | idea
            "key": str,  # 'BLOCK=16', 'flags=-O3 -march=native', or the idea's normalized text
            "operator": str,
            "family": str,
            "toolchain": str,
            "hardware_id": str,
            "arch": str,
            "effect": float,  # measured ratio against the parent (geometric running mean)
            "value": float,  # estimate that the key helps: (wins + 1) / (uses + 2)
            "uses": int,  # observations of the key
            "wins": int,  # ... that were correct and faster beyond noise
            "fails": int,  # ... that were not correct (build, test, crash, timeout)
            "data": str,  # JSON: {"param": name, "value": v} or {"idea": text}, last failure
            "created": str,
            "updated": str,
        },
        pk="id",
        not_null={"text", "kind", "key"},
        defaults={"uses": 0, "wins": 0, "fails": 0, "value": 0.5},
        foreign_keys=[("hardware_id", "hardware", "id")],
    )
    db.table("lessons").create_index(["kind", "key", "operator", "toolchain", "hardware_id"], unique=True)
    db.table("lessons").create_index(["operator"])
    db.table("lessons").create_index(["family"])
    db.table("edges").create(
        {"id": int, "src_kind": str, "src_id": str, "rel": str, "dst_kind": str, "dst_id": str, "note": str},
        pk="id",
        not_null={"src_kind", "src_id", "rel", "dst_kind", "dst_id", "note"},
        defaults={"note": ""},
    )
    db.table("edges").create_index(["src_kind", "src_id", "rel", "dst_kind", "dst_id", "note"], unique=True)
    db.table("edges").create_index(["dst_kind", "dst_id", "rel"])


@migrations()
def m002_llm_usage(db: Database) -> None:
    """Token accounting for the LLM agent: cache columns on runs, and one row per call."""
    db.table("runs").add_column("tokens_cache_read", int)
    db.table("runs").add_column("tokens_cache_write", int)
    db.table("llm_calls").create(
        {
            "id": int,
            "run_id": str,
            "operator": str,
            "model": str,
            "input_tokens": int,
            "output_tokens": int,
            "cache_read": int,
            "cache_write": int,
            "created": str,
        },
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("llm_calls").create_index(["run_id"])


@migrations()
def m003_views(db: Database) -> None:
    """Views for people reading the graph."""
    db.create_view(
        "attempt_summary",
        """
        SELECT a.id, t.operator, t.family, a.toolchain, h.label AS hardware, h.arch, a.agent,
               substr(a.candidate_hash, 1, 8) AS candidate, substr(a.parent_hash, 1, 8) AS parent,
               a.outcome, a.ratio, a.speedup, a.idea, a.run_id, a.created
        FROM attempts a JOIN tasks t ON t.id = a.task_id LEFT JOIN hardware h ON h.id = t.hardware_id
        """,
        replace=True,
    )
    db.create_view(
        "best_per_task",
        """
        SELECT task_id, operator, family, toolchain, hardware, candidate_hash, agent, speedup, idea, params
        FROM (
            SELECT a.task_id, t.operator, t.family, t.toolchain, h.label AS hardware, a.candidate_hash,
                   a.agent, a.speedup, a.idea, a.params,
                   row_number() OVER (PARTITION BY a.task_id ORDER BY a.speedup DESC, a.id) AS rank
            FROM attempts a JOIN tasks t ON t.id = a.task_id LEFT JOIN hardware h ON h.id = t.hardware_id
            WHERE a.outcome IN ('better', 'ok') AND a.speedup IS NOT NULL
        ) WHERE rank = 1
        """,
        replace=True,
    )
    db.create_view(
        "lesson_summary",
        """
        SELECT l.id, l.value, l.uses, l.wins, l.fails, l.effect, l.kind, l.key, l.operator, l.family,
               l.toolchain, h.label AS hardware, l.text,
               (SELECT count(*) FROM edges e WHERE e.src_kind = 'lesson' AND e.src_id = CAST(l.id AS TEXT)
                AND e.rel = 'used_in_context') AS handed_out
        FROM lessons l LEFT JOIN hardware h ON h.id = l.hardware_id
        """,
        replace=True,
    )
    db.create_view(
        "run_usage",
        """
        SELECT r.id, r.agent, r.started, r.finished, count(c.id) AS llm_calls,
               coalesce(sum(c.input_tokens), 0) AS input_tokens,
               coalesce(sum(c.output_tokens), 0) AS output_tokens,
               coalesce(sum(c.cache_read), 0) AS cache_read, coalesce(sum(c.cache_write), 0) AS cache_write,
               (SELECT count(*) FROM attempts a WHERE a.run_id = r.id) AS attempts
        FROM runs r LEFT JOIN llm_calls c ON c.run_id = r.id GROUP BY r.id
        """,
        replace=True,
    )


@migrations()
def m004_ceilings(db: Database) -> None:
    """Measured bandwidth and FMA ceilings per hardware (judge/measure/physics.py), as JSON: the bound no
    honest time can beat, measured once per fingerprint."""
    db.table("ceilings").create(
        {"hardware_id": str, "measured_at": str, "data": str},
        pk="hardware_id",
        not_null={"data"},
        foreign_keys=[("hardware_id", "hardware", "id")],
    )
