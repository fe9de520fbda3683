"""Interrupted runs and runs at once, for real: `python -m pytest --kope-optimize` subprocesses on a copy
of the sample operators in a git repo, sent SIGINT or SIGTERM mid-search, or started twice on one repo.

Each run gets its own TMPDIR, so every /tmp/kope-* folder it makes is known to be its own (others run
on this machine too), and its own cache folder for the machine's register of runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from op_repos import git

SAMPLE_OPS = Path(__file__).resolve().parent.parent / "sample_ops"


def ops_repo(root: Path) -> Path:
    """rowsum and softmax from sample_ops/, committed in a git repo of their own."""
    root.mkdir(parents=True)
    shutil.copy(SAMPLE_OPS / "pytest.ini", root / "pytest.ini")
    for name in ("rowsum", "softmax"):
        shutil.copytree(SAMPLE_OPS / name, root / name)
    told = root.parent / "operator_done.jsonl"  # what a user's plugin is told of each operator
    (root / "conftest.py").write_text(
        "import json\n\n\ndef pytest_kope_operator_done(operator, summary, config):\n"
        f"    with open({str(told)!r}, 'a') as f:\n"
        "        f.write(json.dumps([operator, summary['stopped']['reason']]) + '\\n')\n"
    )
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "operators")
    return root


class Run:
    """One `pytest --kope-optimize` in a subprocess; its output goes to a file we can poll."""

    def __init__(self, repo: Path, tmp: Path, name: str, *args: str):
        self.out = tmp / f"{name}.out"
        self.tmpdir = tmp / f"{name}-tmp"
        self.tmpdir.mkdir()
        env = {**os.environ, "TMPDIR": str(self.tmpdir), "XDG_CACHE_HOME": str(tmp / "cache")}
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
        cmd += ["--kope-optimize", "--kope-no-commit"]
        with open(self.out, "wb") as sink:
            self.proc = subprocess.Popen(
                [*cmd, *args], cwd=repo, env=env, stdout=sink, stderr=subprocess.STDOUT
            )
        self.ended = 0.0

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.text():
            assert self.proc.poll() is None, f"ended before {what!r}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {what!r} within {timeout} s:\n{self.text()}"
            time.sleep(0.2)

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout)
        self.ended = time.monotonic()
        return code

    def left_behind(self) -> list[str]:
        """The temporary folders and files the run left in its TMPDIR."""
        return sorted(p.name for p in self.tmpdir.iterdir())


def attempts(db: Path) -> dict[str, int]:
    """Recorded attempts per run id (read while a run may be writing: WAL readers do not block it)."""
    if not db.exists():
        return {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as c:
        try:
            return dict(c.execute("SELECT run_id, count(*) FROM attempts GROUP BY run_id").fetchall())
        except sqlite3.OperationalError:  # the schema is not there yet
            return {}


def wait_for_verdicts(run: Run, db: Path, n: int, timeout: float = 240) -> None:
    """Until `n` verdicts of this run are in the graph (the baseline is the first)."""
    deadline = time.monotonic() + timeout
    while sum(attempts(db).values()) < n:
        assert run.proc.poll() is None, f"ended before {n} verdicts:\n{run.text()}"
        assert time.monotonic() < deadline, f"fewer than {n} verdicts within {timeout} s:\n{run.text()}"
        time.sleep(0.3)


def report_of(repo: Path, run_id: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((repo / ".kope" / "runs" / run_id / "report.json").read_text())
    return report


def run_id_of(text: str) -> str:
    return text.split("kope: run ", 1)[1].split(",", 1)[0]


def test_ctrl_c_mid_search_reports_cleans_up_and_the_next_run_resumes(tmp_path: Path) -> None:
    repo = ops_repo(tmp_path / "repo")
    db = repo / ".kope" / "experience.db"
    first = Run(repo, tmp_path, "first", "--kope-budget", "40")
    wait_for_verdicts(first, db, 2)  # the baseline and a candidate: mid-search
    first.proc.send_signal(signal.SIGINT)
    assert first.finish() == 2, first.text()
    out = first.text()
    assert "kope: SIGINT: stopping" in out
    assert "kope: interrupted by SIGINT after" in out and "the next run resumes from them" in out
    assert "Traceback" not in out and "INTERNALERROR" not in out and "KeyboardInterrupt" not in out
    assert "kope: results" in out  # the usual table
    run_id = run_id_of(out)
    data = report_of(repo, run_id)
    stops = {o["name"]: o["stopped"] for o in data["operators"]}
    assert stops["rowsum"]["reason"] == "interrupted"
    assert stops["softmax"] == {
        "reason": "interrupted",
        "short": "interrupted",
        "detail": "not started: the run was interrupted",
    }
    told = [json.loads(line) for line in (tmp_path / "operator_done.jsonl").read_text().splitlines()]
    assert sorted(told) == [["rowsum", "interrupted"], ["softmax", "interrupted"]]  # once each, as reported
    rowsum = next(o for o in data["operators"] if o["name"] == "rowsum")
    assert rowsum["verified"] is False and rowsum["baseline_s"] > 0  # what was done is reported
    assert (repo / ".kope" / "runs" / run_id / "report.md").exists()
    assert first.left_behind() == []  # builds, calls, servers: nothing of the run remains
    recorded = attempts(db)
    assert recorded[run_id] >= 2  # every finished verdict is in the graph
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"

    second = Run(repo, tmp_path, "second", "--kope-budget", "2", "--kope-operator", "rowsum")
    assert second.finish() == 0, second.text()
    after = attempts(db)
    assert after[run_id] == recorded[run_id]  # the first run's verdicts stand, none judged twice
    assert after.get(run_id_of(second.text()), 0) >= 1
    assert second.left_behind() == []


def test_one_run_per_repo_the_second_waits_or_refuses(tmp_path: Path) -> None:
    repo = ops_repo(tmp_path / "repo")
    first = Run(repo, tmp_path, "first", "--kope-budget", "40", "--kope-operator", "rowsum")
    first.wait_for("kope: run ")  # the header comes once the run holds the repo
    holder = run_id_of(first.text())

    refused = Run(repo, tmp_path, "refused", "--kope-no-wait", "--kope-operator", "rowsum")
    assert refused.finish() == 4, refused.text()
    errors = [line for line in refused.text().splitlines() if "run.lock" in line]
    assert len(errors) == 1, refused.text()
    assert f"run {holder} (pid {first.proc.pid}, started " in errors[0]
    assert "is optimizing this repo" in errors[0] and "--kope-no-wait" in errors[0]
    assert "Traceback" not in refused.text()

    elsewhere = ops_repo(tmp_path / "other")  # another repo on this machine: told, not stopped
    other = Run(elsewhere, tmp_path, "other", "-k", "no_such_test")
    other.finish()
    assert f"run {holder} (pid {first.proc.pid}" in other.text(), other.text()
    assert "is also running on this machine" in other.text()

    waiting = Run(repo, tmp_path, "waiting", "--kope-budget", "1", "--kope-operator", "rowsum")
    waiting.wait_for(f"kope: waiting for run {holder} (pid {first.proc.pid}, started ")
    first.proc.send_signal(signal.SIGTERM)  # a kill that lets it end cleanly
    assert first.finish() == 2, first.text()
    assert "kope: interrupted by SIGTERM" in first.text()
    assert waiting.finish() == 0, waiting.text()
    assert waiting.ended > first.ended
    after = waiting.text().split("kope: waiting for run", 1)[1]
    assert "kope: run " in after and "kope: results" in after  # it went on once the first ended
