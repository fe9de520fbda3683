"""Small helpers over the graph's rows that every memory module shares (the bottom of `memory/`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from sqlite_utils.db import Database, Table

from ..judge.outcome import Outcome
from ..spec import Point

CORRECT = (Outcome.BETTER.value, Outcome.OK.value)


def now() -> str:
    """The current time as the graph stores it (UTC, ISO 8601)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_id(table: Table) -> int:
    """The primary key of the row just inserted into `table`."""
    if table.last_pk is None:
        raise RuntimeError(f"no row was inserted into {table.name}")
    return int(table.last_pk)


def stored_point(text: str | None) -> Point:
    """An attempt's params as the graph stores them (JSON), as a Point. A value that is no number or
    string (a plugin agent's, or an older kope's) is left out: no model could use it as a tuning value,
    and an old graph must still open."""
    data = json.loads(text) if text else {}
    items = data.items() if isinstance(data, dict) else ()
    return {k: v for k, v in items if isinstance(v, (int, float, str))}


def expand_attempt(row: dict[str, Any]) -> dict[str, Any]:
    """An attempts row with its JSON columns decoded, its params as a Point (`stored_point`)."""
    if "params" in row:
        row["params"] = stored_point(row["params"])
    if "tests_passed" in row:
        row["tests_passed"] = json.loads(row["tests_passed"]) if row["tests_passed"] else []
    return row


@contextlib.contextmanager
def writing(db: Database) -> Iterator[Database]:
    """A write transaction that takes the write lock at its start (BEGIN IMMEDIATE), nested as a
    savepoint. A deferred one that reads first and writes later fails at once with "database is
    locked" when another run wrote in between: WAL mode does not wait for a stale snapshot."""
    if db.conn.in_transaction:
        with db.atomic():
            yield db
        return
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.conn.rollback()
        raise
    db.conn.execute("COMMIT")
