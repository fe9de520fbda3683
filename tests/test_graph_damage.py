"""A damaged or unwritable experience graph: moved aside or refused in one line, never a traceback.

Real files: garbage, a real run's graph with a b-tree page overwritten in its middle, read-only
folders and files (bubblewrap's read-only bind where root can write anything), real runs of a sample
operator in child processes, and the `kope` CLI on the same files.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kope.cli import main
from pytest_kope.judge.controller import sandbox
from pytest_kope.memory.opening import damage

SAMPLE = Path(__file__).parent.parent / "sample_ops"
RUN = ["--kope-budget", "1", "--kope-no-commit", "-p", "no:cacheprovider"]


def sample_op(root: Path) -> Path:
    """A copy of the rowsum sample operator (its tests and pytest.ini) at `root`."""
    shutil.copytree(SAMPLE / "rowsum", root / "rowsum")
    shutil.copy(SAMPLE / "pytest.ini", root / "pytest.ini")
    return root


def pytest_run(cwd: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    cmd = [*prefix, sys.executable, "-m", "pytest", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def optimize(cwd: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return pytest_run(cwd, "--kope-optimize", *RUN, *args, prefix=prefix)


def no_traceback(done: subprocess.CompletedProcess[str]) -> str:
    out = done.stdout + done.stderr
    assert "INTERNALERROR" not in out and "Traceback" not in out, out[-3000:]
    return out


def lines_with(out: str, text: str) -> list[str]:
    return [line for line in out.splitlines() if text in line]


def damage_in_the_middle(path: Path) -> None:
    """Overwrite the root page of the attempts table's b-tree: the file still opens and other tables
    read fine, but SQLite's own page walk finds the damage."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'attempts'").fetchone()[0]
    size, pages = (con.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "page_count"))
    con.close()
    assert 1 < root < pages  # a page in the middle: the header and the schema stay intact
    with path.open("r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\xa5" * size)
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT count(*) FROM hardware").fetchone()[0] >= 1  # it opens and reads
        with pytest.raises(sqlite3.DatabaseError, match="malformed"):
            con.execute("SELECT * FROM attempts").fetchall()
    finally:
        con.close()
    assert damage(path)


def garbage(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not an experience graph\n" * 400)


def moved_aside(kope: Path, logs: bool = False) -> list[Path]:
    """The damaged graphs moved aside in `kope` (with their -wal and -shm files when `logs`)."""
    found = sorted(kope.glob("experience.db.damaged-*"))
    return found if logs else [p for p in found if not p.name.endswith(("-wal", "-shm"))]


def report_of(root: Path) -> dict[str, object]:
    (report,) = (root / ".kope" / "runs").glob("*/report.json")
    data: dict[str, object] = json.loads(report.read_text())
    return data


def read_only(*paths: Path) -> tuple[str, ...]:
    """A command prefix under which `paths` are read-only, even to root."""
    if os.geteuid() != 0:
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        return ()
    if not sandbox.bubblewrap()[0]:
        pytest.skip("root can write any folder, and bubblewrap (for a read-only bind) does not work here")
    binds = [a for p in paths for a in ("--ro-bind", str(p), str(p))]
    return ("bwrap", "--bind", "/", "/", *binds, "--dev", "/dev", "--proc", "/proc")


@pytest.fixture(scope="module")
def a_real_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The graph one optimize run of a sample operator leaves behind."""
    root = sample_op(tmp_path_factory.mktemp("first"))
    done = optimize(root)
    no_traceback(done)
    return root / ".kope" / "experience.db"


def test_a_graph_damaged_in_its_middle_is_moved_aside_and_the_run_goes_on(a_real_graph, tmp_path):
    root = sample_op(tmp_path)
    graph = root / ".kope" / "experience.db"
    graph.parent.mkdir()
    shutil.copy(a_real_graph, graph)
    damage_in_the_middle(graph)
    done = optimize(root)
    out = no_traceback(done)
    assert done.returncode == 0, out[-3000:]
    (said,) = lines_with(out, "is damaged")
    (moved,) = moved_aside(graph.parent)
    assert said.startswith(f"kope: the experience graph {graph} is damaged (")
    assert f"moved it to {moved.name} beside it and started a fresh one" in said
    assert f"sqlite3 {moved.name} .recover | sqlite3 {moved.name}.recovered" in said
    assert f"kope --db experience.db import {moved.name}.jsonl" in said
    assert damage(moved) and not damage(graph)  # the damage went aside whole; the fresh graph is sound
    report = report_of(root)
    operators = report["operators"]
    assert isinstance(operators, list), report
    (operator,) = operators
    assert operator["name"] == "rowsum" and "error" not in operator and operator["evaluations"] >= 1
    with sqlite3.connect(graph) as con:
        assert con.execute("SELECT id FROM runs").fetchall() == [(report["run_id"],)]
        assert con.execute("SELECT count(*) FROM attempts").fetchone()[0] >= 2  # baseline and candidate


def test_kope_doctor_moves_a_garbage_graph_aside_with_its_log(tmp_path):
    root = sample_op(tmp_path)
    graph = root / ".kope" / "experience.db"
    garbage(graph)
    graph.with_name("experience.db-wal").write_bytes(b"a log of garbage" * 64)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_kope.cli", "doctor", "-p", "no:cacheprovider"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = no_traceback(done)
    assert done.returncode == 0, out[-3000:]
    (said,) = lines_with(out, "is damaged")
    assert "(file is not a database)" in said and "started a fresh one" in said
    moved, *companions = moved_aside(graph.parent, logs=True)
    log = moved.with_name(moved.name + "-wal")
    assert log in companions and log.read_bytes().startswith(b"a log of garbage")  # kept for recovery
    assert {p.name for p in companions} <= {moved.name + "-wal", moved.name + "-shm"}
    assert "1 ready to optimize" in out
    assert not damage(graph) and graph.is_file()


def test_a_graph_damaged_during_the_run_stops_the_operator_in_one_line_and_the_report_is_written(tmp_path):
    root = sample_op(tmp_path)
    # after the first candidate is recorded, something overwrites a page of the graph under the run
    (root / "conftest.py").write_text(
        "import sqlite3\nfrom pathlib import Path\n\n\n"
        "def pytest_kope_candidate_judged(operator, result, config):\n"
        "    path = Path(str(config.rootpath)) / '.kope' / 'experience.db'\n"
        "    con = sqlite3.connect(path)\n"
        "    con.execute('PRAGMA wal_checkpoint(TRUNCATE)')\n"
        "    root = con.execute(\"SELECT rootpage FROM sqlite_master WHERE name = 'attempts'\").fetchone()[0]\n"
        "    size = con.execute('PRAGMA page_size').fetchone()[0]\n"
        "    con.close()\n"
        "    with open(path, 'r+b') as f:\n"
        "        f.seek((root - 1) * size)\n"
        "        f.write(b'\\xa5' * size)\n"
    )
    done = optimize(root)
    out = no_traceback(done)
    assert done.returncode == 1, out[-3000:]
    graph = root / ".kope" / "experience.db"
    (said,) = lines_with(out, "is damaged")
    assert said.startswith(f"kope rowsum: STOPPED: the experience graph {graph} is damaged (")
    assert f"`kope --db {graph} graph check`" in said
    operators = report_of(root)["operators"]
    assert isinstance(operators, list), operators
    (operator,) = operators
    assert "is damaged" in operator["error"]
    assert "kope: 1 operator, 0 verified winners" in out  # the closing line: the run ended as a run
    # the next run moves it aside and starts fresh
    (root / "conftest.py").unlink()
    again = pytest_run(root, "--kope-check", "-p", "no:cacheprovider")
    assert again.returncode == 0 and len(moved_aside(graph.parent)) == 1, no_traceback(again)[-3000:]


@pytest.mark.parametrize("mode", ["--kope-optimize", "--kope-check"])
@pytest.mark.parametrize("place", ["under a file", "a folder", "read-only folder", "read-only file"])
def test_an_unwritable_kope_db_is_a_usage_error_naming_it(tmp_path, place, mode):
    root = sample_op(tmp_path / "ops")
    where = tmp_path / "where"
    where.mkdir()
    prefix: tuple[str, ...] = ()
    if place == "under a file":
        (where / "notes.txt").write_text("a file")
        db, why = (
            where / "notes.txt" / "kope" / "experience.db",
            f"{where / 'notes.txt'} is a file, not a folder",
        )
    elif place == "a folder":
        db, why = where, f"--kope-db {where} is a folder; give a file path, such as {where / 'experience.db'}"
    elif place == "read-only folder":
        db, why = where / "experience.db", "make them writable or give --kope-db a writable path"
        prefix = read_only(where)
    else:
        db, why = where / "experience.db", "make them writable or give --kope-db a writable path"
        con = sqlite3.connect(db)
        con.execute("PRAGMA journal_mode = wal").fetchone()
        con.close()
        prefix = read_only(db)
    args = [mode, "--kope-budget", "1", "--kope-no-commit", "-p", "no:cacheprovider", f"--kope-db={db}"]
    done = pytest_run(root, *args, prefix=prefix)
    out = no_traceback(done)
    assert done.returncode == 4, out[-3000:]
    (error,) = lines_with(out, "ERROR:")
    assert str(db) in error and why in error
    assert not (root / ".kope" / "runs").exists() or not list((root / ".kope" / "runs").iterdir())


# -- the `kope` CLI ------------------------------------------------------------------------------


@pytest.fixture
def graphs(a_real_graph, tmp_path):
    """A sound copy of a real graph, one damaged in its middle, and a file of garbage."""
    sound, middle, junk = (tmp_path / name for name in ("sound.db", "middle.db", "junk.db"))
    shutil.copy(a_real_graph, sound)
    shutil.copy(a_real_graph, middle)
    damage_in_the_middle(middle)
    garbage(junk)
    return sound, middle, junk


def test_kope_graph_check_says_sound_or_damaged_in_one_line(graphs, capsys):
    sound, middle, junk = graphs
    assert main(["--db", str(sound), "graph", "check"]) == 0
    assert capsys.readouterr().out == f"kope: {sound} is sound (integrity_check: ok)\n"
    for damaged, why in ((middle, "btreeInitPage() returns error code 11"), (junk, "file is not a database")):
        assert main(["--db", str(damaged), "graph", "check"]) == 1
        (line,) = capsys.readouterr().out.splitlines()
        assert line.startswith(f"kope: {damaged} is damaged (") and why in line
        assert f"sqlite3 {damaged.name} .recover | sqlite3 {damaged.name}.recovered" in line
        assert damaged.is_file() and not moved_aside(damaged.parent)  # checking moves nothing


@pytest.mark.parametrize("command", [["graph", "stats"], ["graph", "show", "rowsum"], ["lessons"]])
def test_reading_a_damaged_graph_is_exit_2_not_a_silent_partial_answer(graphs, capsys, command):
    sound, middle, junk = graphs
    assert main(["--db", str(sound), *command]) == 0
    capsys.readouterr()
    for damaged in (middle, junk):
        assert main(["--db", str(damaged), *command]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        (line,) = captured.err.splitlines()
        assert line.startswith(f"kope: {damaged} is damaged (")


def test_kope_graph_check_without_a_graph_is_exit_2(tmp_path, capsys):
    assert main(["--db", str(tmp_path / "none.db"), "graph", "check"]) == 2
    assert capsys.readouterr().err == f"kope: no experience graph at {tmp_path / 'none.db'}; pass --db PATH\n"
