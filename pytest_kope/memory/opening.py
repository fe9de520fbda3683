"""Opening the experience graph for a run, and telling its failures in one line.

Opening a damaged file is not enough to notice the damage (a page overwritten in the middle opens
fine), so a run first reads every b-tree page (`PRAGMA quick_check`); a damaged graph is moved aside,
with its write-ahead log, and the run starts a fresh one. A place the run cannot write is a usage
error naming it. An SQLite failure later in the run becomes a `GraphFailed` line, never a traceback.
"""

from __future__ import annotations

import datetime
import fcntl
import shlex
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError, KopeError
from .graph import Graph

# SQLite's primary result codes (sqlite.org/rescode.html; fixed by its file format's compatibility)
PERM, BUSY, LOCKED, READONLY, CORRUPT, FULL, CANTOPEN, NOTADB = 3, 5, 6, 8, 11, 13, 14, 26
DAMAGED = {CORRUPT, NOTADB}
NOT_WRITABLE = {CANTOPEN, READONLY, PERM}
COMPANIONS = ("-wal", "-shm")  # SQLite finds a file's write-ahead log by these suffixes


class GraphFailed(KopeError):
    """Reading or writing the experience graph failed during a run (damage, a full disk, a lock)."""


def _code(e: sqlite3.Error) -> int:
    return int(getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF  # the primary code of an extended one


def damage(path: Path, thorough: bool = False) -> str:
    """What is wrong with the SQLite file at `path`, or "" when it is sound (or not there yet).
    `thorough` adds the index-content checks of `integrity_check` to `quick_check`'s page walk.
    Errors other than damage (a folder SQLite cannot open in) are raised."""
    if not path.is_file() or path.stat().st_size == 0:
        return ""
    # read-only: a writing connection, on closing, would fold or delete the write-ahead log beside a
    # damaged file, and with it the last transactions a recovery could still read
    con = sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True)
    try:
        rows = con.execute(f"PRAGMA {'integrity_check' if thorough else 'quick_check'}(1)").fetchall()
    except sqlite3.DatabaseError as e:
        if _code(e) in DAMAGED:
            return str(e)
        raise
    finally:
        con.close()
    found = str(rows[0][0]) if rows else "no answer to the integrity check"
    return "" if found == "ok" else one_line(found)


def recovery(damaged: Path, into: Path | None) -> str:
    """Shell commands that copy what SQLite can still read from `damaged` into the graph `into` (when
    given; else they stop at a `kope export` file to import later), run from `damaged`'s folder."""
    q = shlex.quote
    name = damaged.name
    steps = [] if damaged.parent == Path() else [f"cd {q(str(damaged.parent))}"]
    steps += [
        f"sqlite3 {q(name)} .recover | sqlite3 {q(name + '.recovered')}",
        f"kope --db {q(name + '.recovered')} export {q(name + '.jsonl')}",
    ]
    if into is not None:
        steps.append(f"kope --db {q(str(into))} import {q(name + '.jsonl')}")
    return " && ".join(steps)


def one_line(found: str) -> str:
    """SQLite's integrity report on one line, without its banner."""
    return "; ".join(line.strip() for line in found.splitlines() if line.strip() and "***" not in line)


def open_graph(path: Path, say: Callable[..., None]) -> Graph:
    """The run's graph at `path`: a damaged one is moved aside (said in one line) and a fresh one
    started; a place the run cannot write raises ConfigError naming it and what to do."""
    _check_place(path)
    try:
        with _locked(path):  # one run at a time checks and moves a shared graph
            found = damage(path)
            if found:
                moved = _move_aside(path, found)
                how = recovery(moved, Path(path.name))
                say(
                    f"kope: the experience graph {path} is damaged ({found}): moved it to {moved.name}"
                    f" beside it and started a fresh one; to recover what it held: {how}",
                    red=True,
                )
            _probe_write(path)
        return Graph(path)
    except OSError as e:
        raise ConfigError(_cannot_write(path, e.strerror or str(e))) from None
    except sqlite3.DatabaseError as e:
        if _code(e) in NOT_WRITABLE:
            raise ConfigError(_cannot_write(path, str(e))) from None
        raise ConfigError(
            f"{path} is not a usable experience graph ({e}); move it away or give --kope-db another path"
        ) from None


def _cannot_write(path: Path, why: str) -> str:
    return (
        f"cannot write the experience graph {path} ({why}); SQLite needs the file and its folder writable"
        f" (it keeps {path.name}-wal beside it): make them writable or give --kope-db a writable path"
    )


def _check_place(path: Path) -> None:
    """A folder, or a path under a file, can never hold the graph: say which."""
    if path.is_dir():
        raise ConfigError(f"--kope-db {path} is a folder; give a file path, such as {path / 'experience.db'}")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(
            f"cannot write the experience graph {path}: {blocking} is a file, not a folder;"
            " give --kope-db a path in a folder"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(_cannot_write(path, f"cannot create {path.parent}: {e.strerror}")) from None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _move_aside(path: Path, found: str) -> Path:
    """Rename the damaged file and its write-ahead log to `<name>.damaged-<time>` (never over another)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    moved, n = path.with_name(f"{path.name}.damaged-{stamp}"), 1
    while any(moved.with_name(moved.name + s).exists() for s in ("", *COMPANIONS)):
        n += 1
        moved = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    try:
        path.rename(moved)
    except OSError as e:
        raise ConfigError(
            f"the experience graph {path} is damaged ({found}) and cannot be moved aside ({e.strerror});"
            " move it away yourself, or give --kope-db another path"
        ) from None
    for suffix in COMPANIONS:
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            companion.rename(moved.with_name(moved.name + suffix))
    return moved


def _probe_write(path: Path) -> None:
    """Write nothing, but as a run would: a read-only file opens fine and fails only at its first write."""
    con = sqlite3.connect(path, isolation_level=None)
    try:
        version = int(con.execute("PRAGMA user_version").fetchone()[0])
        con.execute("BEGIN IMMEDIATE")
        con.execute(f"PRAGMA user_version = {version}")
        con.execute("ROLLBACK")
    finally:
        con.close()


def failure(path: Path, e: sqlite3.Error) -> str:
    """One line for an SQLite error met mid-run: what happened to which file, and what to do."""
    code = _code(e)
    if code in DAMAGED:
        return (
            f"the experience graph {path} is damaged ({e}); the next run moves it aside and starts a fresh"
            f" one (`kope --db {shlex.quote(str(path))} graph check` says how to recover what it holds)"
        )
    if code == FULL:
        return f"cannot write the experience graph {path} ({e}): free space on its disk and run again"
    if code in (BUSY, LOCKED):
        return (
            f"the experience graph {path} stayed locked by another process ({e}); let it finish,"
            " or give --kope-db another path"
        )
    if code in NOT_WRITABLE:
        return _cannot_write(path, str(e))
    return f"the experience graph {path} failed ({e}); check its disk, or give --kope-db another path"


class GraphGuard:
    """The run's graph and its SQLite failures, each told once: `failing` turns one into `GraphFailed`
    (an operator stops on it), `surviving` says it and goes on (the report is written without it)."""

    def __init__(self, say: Callable[..., None]):
        self.say = say
        self.path = Path("experience.db")
        self.told: set[str] = set()

    def open(self, path: Path) -> Graph:
        self.path = path
        return open_graph(path, self.say)

    @contextmanager
    def failing(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.ProgrammingError:  # a bug of ours, not the file's: keep its traceback
            raise
        except sqlite3.DatabaseError as e:
            line = failure(self.path, e)
            self.told.add(line)
            raise GraphFailed(line) from None

    @contextmanager
    def surviving(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.ProgrammingError:
            raise
        except sqlite3.DatabaseError as e:
            line = failure(self.path, e)
            if line not in self.told:
                self.told.add(line)
                self.say(f"kope: {line}", red=True)
