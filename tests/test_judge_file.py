"""`kope judge OP FILE`: one candidate file judged exactly as an optimize run judges it, on a copy of
the sample rowsum operator: real build, real children, real timing; the exit status is the verdict."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parent.parent / "sample_ops"
TWIN = Path(__file__).resolve().parent / "adversarial" / "round2" / "rowsum" / "plain_twin.c"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(SAMPLE / "rowsum", tmp_path / "ops" / "rowsum")
    shutil.copytree(SAMPLE / "softmax", tmp_path / "ops" / "softmax")
    shutil.copy(SAMPLE / "pytest.ini", tmp_path / "ops" / "pytest.ini")
    return tmp_path / "ops"


def kope_judge(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from pytest_kope.cli import main; raise SystemExit(main())", "judge", *args]
    return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)


def test_an_honest_faster_kernel_is_a_verified_winner_and_exits_0(repo: Path, tmp_path: Path) -> None:
    shutil.copy(TWIN, tmp_path / "twin.c")
    shutil.copy(TWIN.with_suffix(".json"), tmp_path / "twin.json")  # its flags, as a run would take them
    ran = kope_judge(repo, "rowsum", str(tmp_path / "twin.c"))
    last = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert last.startswith("kope judge: rowsum ") and ": better: verified in fresh processes: " in last, last
    speedup = last.split("fresh processes: ")[1].split(" ")[0]  # one set of figures: the table's
    (row,) = [line for line in ran.stdout.splitlines() if line.startswith("rowsum ")]
    assert f" {speedup} " in f" {row} ", (last, row)
    assert "softmax" not in ran.stdout.split("kope: results")[-1]  # --kope-operator: rowsum alone
    assert (
        not list((repo / "rowsum").glob("*.orig"))
        and (repo / "rowsum" / "rowsum.c").read_text() == (SAMPLE / "rowsum" / "rowsum.c").read_text()
    )


def test_a_wrong_kernel_exits_1_with_the_reason(repo: Path, tmp_path: Path) -> None:
    wrong = TWIN.read_text().replace("y[r] = s;", "y[r] = s + (r == 5);")
    (tmp_path / "wrong.c").write_text(wrong)
    ran = kope_judge(repo, "rowsum", str(tmp_path / "wrong.c"))
    last = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert ": incorrect: " in last and "test_rowsum_matches_reference" in last, last


def test_bad_input_is_one_line_and_exit_2(repo: Path, tmp_path: Path) -> None:
    missing = kope_judge(repo, "rowsum", str(tmp_path / "nope.c"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "nope.c" in missing.stderr and "no such file" in missing.stderr
    (tmp_path / "k.c").write_text(TWIN.read_text())
    unknown = kope_judge(repo, "rownope", str(tmp_path / "k.c"))
    assert unknown.returncode == 2, unknown.stdout[-2000:]
    assert "--kope-operator rownope: no such operator" in unknown.stdout + unknown.stderr
    assert "rowsum, softmax" in unknown.stdout + unknown.stderr


def test_a_wrong_file_exits_1_in_a_repo_whose_graph_knows_a_better_kernel(repo: Path, tmp_path: Path) -> None:
    """The repo's graph holds a verified faster rowsum (a replay run): `kope judge` judges the file it
    is given, not that one, and writes nothing to the repo's graph for a later run to resume from."""
    known = tmp_path / "known" / "rowsum"
    known.mkdir(parents=True)
    shutil.copy(TWIN, known / "twin.c")
    shutil.copy(TWIN.with_suffix(".json"), known / "twin.json")
    warm = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kope-optimize", "--kope-no-commit"]
    warm += [f"--kope-agent=replay:{known.parent}", "--kope-operator", "rowsum", "--kope-budget", "1"]
    warmed = subprocess.run(warm, cwd=repo, capture_output=True, text=True, timeout=600)
    assert warmed.returncode == 0 and "1 verified winner" in warmed.stdout, warmed.stdout[-3000:]
    graph = repo / ".kope" / "experience.db"
    before = attempts(graph)
    (tmp_path / "wrong.c").write_text(TWIN.read_text().replace("y[r] = s;", "y[r] = s + (r == 5);"))
    ran = kope_judge(repo, "rowsum", str(tmp_path / "wrong.c"))
    last = ran.stdout.strip().splitlines()[-1]
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert ": incorrect: " in last and "resuming from" not in ran.stdout, last
    assert attempts(graph) == before  # nothing of the check is left for a later run to build on


def attempts(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return int(c.execute("SELECT count(*) FROM attempts").fetchone()[0])


SAMPLE_TRITON = SAMPLE.parent / "sample_ops_triton"


def _triton_on_cpu() -> bool:
    import importlib.util

    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return False
    from pytest_kope.toolchains.triton import TritonToolchain

    return TritonToolchain().mode() == "interpreter"


@pytest.mark.skipif(
    not _triton_on_cpu(), reason="needs triton and torch, and no GPU (Triton's CPU interpreter)"
)
def test_a_triton_file_on_a_cpu_gets_a_correctness_verdict_not_timed(tmp_path: Path) -> None:
    """Nothing can time Triton's interpreter, yet the file is judged: its tests, the differential
    check, exit 0 when it is correct and 1 when it is not, "not timed" said in the verdict's line."""
    repo = tmp_path / "ops"
    shutil.copytree(SAMPLE_TRITON / "softmax", repo / "softmax")
    for name in ("pytest.ini", "conftest.py"):
        shutil.copy(SAMPLE_TRITON / name, repo / name)
    text = (SAMPLE_TRITON / "softmax" / "softmax.py").read_text()
    (tmp_path / "honest.py").write_text(text.replace("BLOCK = 1024\n", "BLOCK = 1024  # hand-written\n", 1))
    (tmp_path / "wrong.py").write_text(text.replace("tl.exp(x - m) * inv", "tl.exp(x - m) * inv * 1.01"))
    honest = kope_judge(repo, "softmax", str(tmp_path / "honest.py"))
    last = honest.stdout.strip().splitlines()[-1]
    assert honest.returncode == 0, honest.stdout[-3000:] + honest.stderr[-2000:]
    assert last.startswith("kope judge: softmax ") and ": ok: " in last and "; not timed: " in last, last
    wrong = kope_judge(repo, "softmax", str(tmp_path / "wrong.py"))
    last = wrong.stdout.strip().splitlines()[-1]
    assert wrong.returncode == 1, wrong.stdout[-3000:] + wrong.stderr[-2000:]
    assert ": incorrect: " in last and "; not timed: " in last, last
