"""The experience graph: everything ever tried, seen and learned, in one SQLite file.

Only the controller writes it. Each attempt is written whole (source, attempt, observations, edges) in
one transaction, so a run killed at any instant leaves the file consistent and the next run resumes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..hardware import fingerprint_id
from ..judge.outcome import Judged, Outcome, Timing
from .observe import observations_of, token_counts
from .rows import CORRECT, expand_attempt, new_id, now, writing  # noqa: F401 - CORRECT, now re-exported
from .schema import EDGE_RELATIONS, open_database
from .scope import hardware_row


def text_hash(text: str) -> str:
    """The content hash naming a source text in the graph."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


class Graph:
    """The experience graph at `path` (created with its parent folder; schema migrated; WAL)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.db = open_database(self.path)

    def close(self) -> None:
        self.db.close()

    def checkpoint(self) -> bool:
        """Fold the write-ahead log into the database file and truncate it (before a CI cache saves
        the file alone); False when another connection kept it from completing."""
        busy, _, _ = self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rows(self, sql: str, params: dict[str, Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Run a query and return its rows as dicts."""
        cursor = self.db.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def one(self, sql: str, params: dict[str, Any] | tuple[Any, ...] = ()) -> dict[str, Any] | None:
        found = self.rows(sql, params)
        return found[0] if found else None

    # -- scope: hardware, tasks, runs ---------------------------------------------------------------

    def hardware_id(self, fingerprint: Mapping[str, Any]) -> str:
        """The id of a fingerprint, inserting its row the first time it is seen."""
        row = hardware_row(fingerprint)
        with writing(self.db):
            self.db.table("hardware").insert({**row, "created": now()}, ignore=True)
        return str(row["id"])

    def task_id(
        self, operator: str, family: str, toolchain: str, hardware: Mapping[str, Any], shapes: str = ""
    ) -> int:
        """The task of (operator, hardware, toolchain), created on first use; family and shapes are
        updated when given."""
        hw = self.hardware_id(hardware)
        with writing(self.db):
            found = self.one(
                "SELECT id, family, shapes FROM tasks WHERE operator = ? AND hardware_id = ? AND toolchain = ?",
                (operator, hw, toolchain),
            )
            if found is None:
                row = {"operator": operator, "family": family, "toolchain": toolchain, "shapes": shapes}
                return new_id(self.db.table("tasks").insert({**row, "hardware_id": hw, "created": now()}))
            update = {k: v for k, v in (("family", family), ("shapes", shapes)) if v and v != found[k]}
            if update:
                self.db.table("tasks").update(found["id"], update)
            return int(found["id"])

    def task(self, task_id: int) -> dict[str, Any]:
        """A task row with its hardware's arch and label."""
        row = self.one(
            "SELECT t.*, h.arch, h.label AS hardware FROM tasks t LEFT JOIN hardware h ON h.id = t.hardware_id"
            " WHERE t.id = ?",
            (task_id,),
        )
        if row is None:
            raise KeyError(f"no task {task_id} in {self.path}")
        return row

    def tasks(self, operator: str | None = None) -> list[dict[str, Any]]:
        where, params = ("WHERE t.operator = ?", (operator,)) if operator else ("", ())
        return self.rows(
            "SELECT t.*, h.arch, h.label AS hardware FROM tasks t LEFT JOIN hardware h ON h.id = t.hardware_id "
            f"{where} ORDER BY t.operator, t.id",
            params,
        )

    def start_run(self, run_id: str, agent: str, hardware: Mapping[str, Any]) -> None:
        hw = self.hardware_id(hardware)
        with writing(self.db):
            self._ensure_run(run_id)
            self.db.table("runs").update(run_id, {"agent": agent, "hardware_id": hw})

    def finish_run(self, run_id: str, usage: Mapping[str, Any]) -> None:
        """Close a run with the agent's usage (token counts; the rest kept as notes). Token counts the
        usage lacks are summed from the run's recorded LLM calls."""
        with writing(self.db):
            self._ensure_run(run_id)
            calls = (
                self.one(
                    "SELECT sum(input_tokens) i, sum(output_tokens) o, sum(cache_read) r, sum(cache_write) w"
                    " FROM llm_calls WHERE run_id = ?",
                    (run_id,),
                )
                or {}
            )
            tokens = token_counts(usage)
            self.db.table("runs").update(
                run_id,
                {
                    "finished": now(),
                    "tokens_in": tokens["input_tokens"] or calls.get("i") or 0,
                    "tokens_out": tokens["output_tokens"] or calls.get("o") or 0,
                    "tokens_cache_read": tokens["cache_read"] or calls.get("r") or 0,
                    "tokens_cache_write": tokens["cache_write"] or calls.get("w") or 0,
                    "notes": _json(dict(usage)),
                },
            )

    def record_llm_call(self, run_id: str, operator: str, model: str, usage: Mapping[str, Any]) -> None:
        """One LLM call's token usage (Anthropic `usage` names or the short ones)."""
        with writing(self.db):
            self._ensure_run(run_id)
            row = {
                "run_id": run_id,
                "operator": operator,
                "model": model,
                **token_counts(usage),
                "created": now(),
            }
            self.db.table("llm_calls").insert(row)

    def _ensure_run(self, run_id: str) -> None:
        self.db.table("runs").insert({"id": run_id, "started": now()}, ignore=True)

    def ceilings(self, hardware: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored physics ceilings of this hardware (Ceilings.to_json()), or None."""
        row = self.one("SELECT data FROM ceilings WHERE hardware_id = ?", (fingerprint_id(hardware),))
        return json.loads(row["data"]) if row else None

    def save_ceilings(self, hardware: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """Store (replacing) this hardware's physics ceilings."""
        hw = self.hardware_id(hardware)
        with writing(self.db):
            row = {"hardware_id": hw, "measured_at": now(), "data": _json(dict(data))}
            self.db.table("ceilings").upsert(row, pk="hardware_id")

    # -- attempts -----------------------------------------------------------------------------------

    def _attempt_id(self, task_id: int, candidate_hash: str) -> int | None:
        row = self.db.execute(
            "SELECT id FROM attempts WHERE task_id = ? AND candidate_hash = ?", (task_id, candidate_hash)
        ).fetchone()
        return int(row[0]) if row else None

    def record(self, task_id: int, run_id: str, judged: Judged) -> int:
        """Write one judged candidate whole, in one transaction; recording it again changes nothing."""
        c = judged.candidate
        outcome = Outcome(judged.outcome).value
        with writing(self.db):
            existing = self._attempt_id(task_id, c.hash)
            if existing is not None:
                return existing
            self._ensure_run(run_id)
            source_hash = text_hash(c.source)
            self.db.table("sources").insert(
                {"hash": source_hash, "text": c.source, "size": len(c.source)}, ignore=True
            )
            attempt = {
                "task_id": task_id,
                "candidate_hash": c.hash,
                "source_hash": source_hash,
                "filename": c.filename,
                "params": _json(c.params),
                "toolchain": c.toolchain,
                "agent": c.agent,
                "idea": c.idea,
                "parent_hash": c.parent,
                "run_id": run_id,
                "outcome": outcome,
                "ratio": judged.ratio,
                "ratio_low": judged.ratio_low,
                "time_s": judged.time_s,
                "speedup": judged.speedup,
                "seconds": judged.seconds,
                "tests_passed": _json(judged.tests_passed),
                "distilled": 0,
                "created": now(),
            }
            attempt_id = new_id(self.db.table("attempts").insert(attempt))
            for kind, text, data in observations_of(judged):
                self._observe(attempt_id, kind, text, data)
            hw = self.db.execute("SELECT hardware_id FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if hw:
                self.edge("attempt", attempt_id, "evaluated_on", "hardware", hw[0])
            self.link_parents(task_id)
            return attempt_id

    def mark_committed(self, task_id: int, candidate_hash: str, branch: str, commit: str) -> None:
        """Note that the attempt is what `branch` holds: what a reviewer merges, fastest or not."""
        with writing(self.db):
            if (attempt := self._attempt_id(task_id, candidate_hash)) is not None:
                text, data = f"committed to {branch} as {commit}", {"branch": branch, "commit": commit}
                self._observe(attempt, "committed", text, data)

    def last_committed(self, task_id: int) -> dict[str, Any] | None:
        """The attempt last committed for the task (`mark_committed`): candidate_hash, and the branch
        and commit it went to; None when nothing was."""
        last = "a.task_id = ? AND o.kind = 'committed' ORDER BY o.id DESC LIMIT 1"
        row = self.one(
            "SELECT a.candidate_hash, o.data FROM observations o JOIN attempts a ON a.id = o.attempt_id"
            f" WHERE {last}",
            (task_id,),
        )
        if row is None:
            return None
        data = json.loads(row["data"]) if row["data"] else {}
        return {"candidate_hash": row["candidate_hash"], **(data if isinstance(data, dict) else {})}

    def _observe(self, attempt_id: int, kind: str, text: str, data: Any) -> None:
        obs = {"attempt_id": attempt_id, "kind": kind, "text": text, "data": _json(data)}
        obs_id = new_id(self.db.table("observations").insert(obs))
        self.edge("attempt", attempt_id, "observed", "observation", obs_id)

    def link_parents(self, task_id: int) -> None:
        """derived_from edges for every attempt of the task whose parent is recorded (either order)."""
        self.db.execute(
            "INSERT OR IGNORE INTO edges (src_kind, src_id, rel, dst_kind, dst_id, note)"
            " SELECT 'attempt', CAST(c.id AS TEXT), 'derived_from', 'attempt', CAST(p.id AS TEXT), ''"
            " FROM attempts c JOIN attempts p ON p.task_id = c.task_id AND p.candidate_hash = c.parent_hash"
            " WHERE c.task_id = ?",
            (task_id,),
        )

    def edge(
        self, src_kind: str, src_id: object, rel: str, dst_kind: str, dst_id: object, note: str = ""
    ) -> None:
        if rel not in EDGE_RELATIONS:
            raise ValueError(f"unknown edge relation {rel!r}; use one of {', '.join(EDGE_RELATIONS)}")
        self.db.execute(
            "INSERT OR IGNORE INTO edges (src_kind, src_id, rel, dst_kind, dst_id, note) VALUES (?, ?, ?, ?, ?, ?)",
            (src_kind, str(src_id), rel, dst_kind, str(dst_id), note),
        )

    def lookup(self, task_id: int, candidate_hash: str) -> dict[str, Any] | None:
        """The recorded attempt of this candidate on this task, or None: no attempt is judged twice."""
        row = self.one(
            "SELECT a.*, s.text AS source FROM attempts a LEFT JOIN sources s ON s.hash = a.source_hash"
            " WHERE a.task_id = ? AND a.candidate_hash = ?",
            (task_id, candidate_hash),
        )
        return expand_attempt(row) if row else None

    def judged(self, task_id: int, candidate_hash: str) -> Judged | None:
        """The recorded verdict rebuilt as a Judged (for resuming without judging again)."""
        row = self.lookup(task_id, candidate_hash)
        if row is None:
            return None
        candidate = Candidate(
            source=row["source"] or "",
            filename=row["filename"] or "",
            toolchain=row["toolchain"] or "",
            params=row["params"],
            idea=row["idea"] or "",
            agent=row["agent"] or "",
            parent=row["parent_hash"],
        )
        obs = self.observations(row["id"])
        return Judged(
            candidate=candidate,
            outcome=Outcome(row["outcome"]),
            failures=[o["text"] for o in obs if o["kind"] in ("test_failure", "screen")],
            build_log=next((o["text"] for o in obs if o["kind"] == "build_log"), ""),
            timings=[Timing(**o["data"]) for o in obs if o["kind"] == "timing"],
            tests_passed=row["tests_passed"],
            speedup=row["speedup"],
            seconds=row["seconds"] or 0.0,
            notes=[o["text"] for o in obs if o["kind"] == "note"],
        )

    def observations(self, attempt_id: int) -> list[dict[str, Any]]:
        rows = self.rows("SELECT * FROM observations WHERE attempt_id = ? ORDER BY id", (attempt_id,))
        for r in rows:
            r["data"] = json.loads(r["data"]) if r["data"] else {}
        return rows

    def attempts(self, task_id: int) -> list[dict[str, Any]]:
        """Every attempt of a task, oldest first, with params decoded (no source text)."""
        return [
            expand_attempt(r)
            for r in self.rows("SELECT * FROM attempts WHERE task_id = ? ORDER BY id", (task_id,))
        ]

    def best(self, task_id: int) -> dict[str, Any] | None:
        """The fastest correct attempt of a task (by speedup against the baseline), with its source."""
        return self._attempt(
            "a.outcome IN (?, ?) AND a.speedup IS NOT NULL ORDER BY a.speedup DESC, a.id", task_id, *CORRECT
        )

    def incumbent(self, task_id: int) -> dict[str, Any] | None:
        """Where the task's latest search ended: its newest attempt judged better than the incumbent
        of its day. A faster-measured attempt the judge found no better than that one is noise."""
        return self._attempt("a.outcome = ? ORDER BY a.id DESC", task_id, Outcome.BETTER.value)

    def _attempt(self, where_order: str, task_id: int, *args: Any) -> dict[str, Any] | None:
        row = self.one(
            "SELECT a.*, s.text AS source FROM attempts a LEFT JOIN sources s ON s.hash = a.source_hash"
            f" WHERE a.task_id = ? AND {where_order} LIMIT 1",
            (task_id, *args),
        )
        return expand_attempt(row) if row else None

    # -- learning and recall ------------------------------------------------------------------------

    def mark_used(self, run_id: str, operator: str, lesson_ids: list[int]) -> None:
        """Remember which lessons were handed to the agent (used_in_context edges)."""
        with writing(self.db):
            self._ensure_run(run_id)
            for lesson in lesson_ids:
                self.edge("lesson", lesson, "used_in_context", "run", run_id, note=operator)

    def lessons(self, operator: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Lessons, most valuable first (value, then evidence)."""
        params: list[Any] = [operator] if operator else []
        where = "WHERE operator = ?" if operator else ""
        sql = f"SELECT * FROM lessons {where} ORDER BY value DESC, uses DESC, id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return self.rows(sql, tuple(params))

    # -- reporting and exchange ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Row counts per table, attempts per outcome and per agent, lesson totals."""
        tables = [t for t in self.db.table_names() if not t.startswith("_") and "_fts" not in t]
        counts = {t: self.db.table(t).count for t in tables}

        def grouped(column: str) -> dict[str, int]:
            sql = f"SELECT coalesce({column}, ''), count(*) FROM attempts GROUP BY 1 ORDER BY 2 DESC"
            return {str(k): int(n) for k, n in self.db.execute(sql).fetchall()}

        return {
            "path": str(self.path),
            "tables": counts,
            "outcomes": grouped("outcome"),
            "agents": grouped("agent"),
            "operators": grouped("(SELECT operator FROM tasks WHERE tasks.id = attempts.task_id)"),
            "ceilings": [
                {**r, "data": json.loads(r["data"])}
                for r in self.rows(
                    "SELECT coalesce(h.label, c.hardware_id) AS hardware, c.measured_at, c.data"
                    " FROM ceilings c LEFT JOIN hardware h ON h.id = c.hardware_id ORDER BY c.measured_at"
                )
            ],
        }

    def iter_rows(self, table: str, order: str = "rowid") -> Iterator[dict[str, Any]]:
        yield from self.db.query(f"SELECT * FROM [{table}] ORDER BY {order}")
