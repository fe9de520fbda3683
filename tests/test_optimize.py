"""`pytest --kope-optimize` end to end on real operator repos in tmp dirs: real gcc, git and SQLite."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from op_repos import SCALE_C, SCALE_TEST, UNJAILED, git, make_op_repo, path_without_bwrap


def status(root: Path) -> str:
    """git status, less the files pytester's subprocess runner writes into its cwd."""
    noise = {"stdout", "stderr", "runpytest-current"}
    lines = git(root, "status", "--porcelain").splitlines()
    return "\n".join(line for line in lines if line[3:] not in noise)


def report_of(root: Path) -> dict[str, Any]:
    (path,) = (root / ".kope" / "runs").glob("*/report.json")
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def run_optimize(pytester: pytest.Pytester, *args: str):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kope-optimize", *args, timeout=600)


def test_tuner_commits_verified_winner_and_leaves_checkout_untouched(
    pytester: pytest.Pytester, op_repo
) -> None:
    root = op_repo
    (root / "scale" / "scale.c").write_text(SCALE_C + "/* local edit, not committed */\n")  # a dirty tree
    (root / "notes.txt").write_text("untracked\n")
    git(root, "add", "notes.txt")
    status_before = status(root)
    head_before = git(root, "rev-parse", "HEAD")
    branch_before = git(root, "branch", "--show-current")
    diff_before = git(root, "diff") + git(root, "diff", "--cached")

    result = run_optimize(pytester, "--kope-budget", "3", "--kope-agent", "tuner")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*kope: toolchain c: available*",
            "*kope scale: */3 evaluations, best *x*",
            "*kope: results*",
            "*scale*yes*kope/scale*",
            "*= kope: 1 operator, 1 verified winner (*x), 0 stopped in *",
        ]
    )
    assert "no tests ran" not in result.stdout.str()
    assert status(root) == status_before
    assert git(root, "rev-parse", "HEAD") == head_before
    assert git(root, "branch", "--show-current") == branch_before
    assert git(root, "diff") + git(root, "diff", "--cached") == diff_before

    message = git(root, "log", "-1", "--format=%B", "kope/scale")
    assert message.startswith("kope(scale): ") and "x faster on " in message.splitlines()[0]
    for needle in (
        "| test",
        "Correctness tests passed",
        "Lineage: baseline ->",
        "Kope-Run: ",
        "Kope-Speedup: ",
        "Kope-Hardware: ",
    ):
        assert needle in message
    assert git(root, "rev-parse", "kope/scale~1").strip() == head_before.strip()
    committed = git(root, "show", "kope/scale:scale/scale.c")
    assert "-O2 -march=native | -O0" in committed  # the winner's flags baked in as the default
    assert "local edit" in committed  # the run judged the working tree's kernel, and says so
    assert "uncommitted changes" in message

    data = report_of(root)
    assert {"run_id", "hardware", "agent"} <= set(data)
    (op,) = data["operators"]
    for key in (
        "name",
        "baseline_s",
        "best_s",
        "speedup",
        "evaluations",
        "evaluations_to_best",
        "verified",
        "branch",
        "commit",
        "candidates",
    ):
        assert key in op
    assert op["verified"] and op["speedup"] > 1.05 and op["best_s"] < op["baseline_s"]
    assert all({"id", "idea", "params", "outcome"} <= set(c) for c in op["candidates"])
    md = (root / ".kope" / "runs" / data["run_id"] / "report.md").read_text()
    assert "## scale" in md and "- Why the search stopped: " in md and "```" not in md
    assert op["stopped"]["reason"] in ("budget", "no_gain", "converged")
    # the operator's time is its whole way, baseline to commit, most of a one-operator run (its
    # verification alone, a third of it here, was once all it counted)
    assert 0.6 * data["seconds"] <= op["seconds"] <= data["seconds"]

    # A rerun starts from the known best, judges nothing twice, and adds no commit.
    tip = git(root, "rev-parse", "kope/scale")
    again = run_optimize(pytester, "--kope-budget", "3", "--kope-agent", "tuner")
    assert again.ret == 0, again.stdout.str()
    assert git(root, "rev-parse", "kope/scale") == tip
    # every point was tried in the first run: the search stops at once, and says why
    again.stdout.fnmatch_lines(["*kope scale: search stopped: tried every point of the tuning space*"])
    db = sqlite3.connect(root / ".kope" / "experience.db")
    dupes = db.execute(
        "SELECT count(*) FROM (SELECT task_id, candidate_hash FROM attempts "
        "GROUP BY 1, 2 HAVING count(*) > 1)"
    ).fetchone()[0]
    assert dupes == 0
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


SEGFAULT = SCALE_C.replace("for (; i < n; i++) y[i] = 2.0f * x[i];", "*(volatile int *)0 = 1;")
HANG = SCALE_C.replace("for (; i < n; i++) y[i] = 2.0f * x[i];", "for (volatile int k = 1; k; ) { }")
ODD_WRONG = SCALE_C.replace(
    "for (; i < n; i++) y[i] = 2.0f * x[i];", "for (; i < n; i++) y[i] = (n % 2) ? 0.0f : 2.0f * x[i];"
)


def test_replay_candidates_that_crash_hang_or_cheat_are_failures_not_crashes(
    pytester: pytest.Pytester, op_repo
) -> None:
    replay = pytester.path / "cands" / "scale"
    replay.mkdir(parents=True)
    for name, text in (("a_segfault", SEGFAULT), ("b_hang", HANG), ("c_oddwrong", ODD_WRONG)):
        (replay / f"{name}.c").write_text(text)
    (replay / "c_oddwrong.json").write_text(json.dumps({"idea": "skip odd shapes", "params": {"UNROLL": 4}}))
    result = run_optimize(
        pytester,
        "--kope-agent",
        f"replay:{pytester.path / 'cands'}",
        *UNJAILED,
        "--kope-budget",
        "5",
        "--kope-timeout",
        "15",
        "--kope-no-commit",
    )
    assert result.ret == 0, result.stdout.str()
    outcomes = {c["idea"]: c for c in report_of(pytester.path)["operators"][0]["candidates"]}
    assert outcomes["replayed a_segfault.c"]["outcome"] == "crashed"
    assert "SIGSEGV" in outcomes["replayed a_segfault.c"]["failures"][0]
    assert outcomes["replayed b_hang.c"]["outcome"] == "timeout"
    odd = outcomes["skip odd shapes"]
    assert odd["outcome"] == "incorrect" and odd["params"]["UNROLL"] == 4
    assert "git" not in git(pytester.path, "branch", "--list", "kope/*")
    # three files, budget five: the folder ran out, and the report says so in words
    result.stdout.fnmatch_lines(["*kope scale: search stopped: the replay agent proposed nothing new*"])


def test_broken_baseline_stops_that_operator_and_others_go_on(pytester: pytest.Pytester) -> None:
    make_op_repo(pytester.path, commit=False)
    make_op_repo(
        pytester.path,
        SCALE_C.replace("scale", "twice").replace("2.0f", "2.5f"),
        SCALE_TEST.replace("scale", "twice"),
        name="twice",
    )
    result = run_optimize(pytester, "--kope-budget", "1", "--kope-agent", "tuner", "--kope-no-commit")
    assert result.ret == 1  # an operator stopped on an error
    result.stdout.fnmatch_lines(
        [
            "*kope twice: STOPPED: the committed kernel */twice.c fails its own correctness*",
            "*twice*error*error: the committed kernel*",
            "*= kope: 2 operators, *, 1 stopped in *",
        ]
    )
    ops = {o["name"]: o for o in report_of(pytester.path)["operators"]}
    assert "error" in ops["twice"] and ops["scale"]["evaluations"] == 1
    assert ops["twice"]["stopped"]["reason"] == "error" and ops["scale"]["stopped"]["reason"] == "budget"


def test_k_selects_operators(pytester: pytest.Pytester) -> None:
    make_op_repo(pytester.path, commit=False)
    make_op_repo(
        pytester.path, SCALE_C.replace("scale", "twice"), SCALE_TEST.replace("scale", "twice"), name="twice"
    )
    result = run_optimize(pytester, "--kope-budget", "1", "--kope-no-commit", "-k", "twice")
    assert result.ret == 0, result.stdout.str()  # finished, winner or not
    result.stdout.fnmatch_lines(["*= kope: 1 operator, *, 0 stopped, * deselected in *"])
    assert [o["name"] for o in report_of(pytester.path)["operators"]] == ["twice"]


def test_a_spent_time_budget_ends_the_run_cleanly(pytester: pytest.Pytester) -> None:
    make_op_repo(pytester.path, commit=False)
    make_op_repo(
        pytester.path, SCALE_C.replace("scale", "twice"), SCALE_TEST.replace("scale", "twice"), name="twice"
    )
    for option in (["--kope-time-budget", "0"], ["-o", "kope_time_budget=0"]):
        result = run_optimize(pytester, "--kope-no-commit", *option)
        assert result.ret == 0, result.stdout.str()
        result.stdout.fnmatch_lines(
            [
                "*kope scale: not started: the time budget (0 min) ran out before it began*",
                "*= kope: 2 operators, 0 verified winners, 0 stopped, 2 not reached (time budget) in *",
            ]
        )
    reports = sorted((pytester.path / ".kope" / "runs").glob("*/report.json"))
    ops = json.loads(reports[-1].read_text())["operators"]
    assert [o["stopped"]["reason"] for o in ops] == ["not_reached", "not_reached"]


def test_claude_without_key_is_one_line_error(pytester: pytest.Pytester, op_repo, monkeypatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    result = run_optimize(pytester, "--kope-agent", "claude")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kope-agent claude needs ANTHROPIC_API_KEY*"])


def test_untrusted_agents_run_only_in_the_jail(
    pytester: pytest.Pytester, op_repo, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", path_without_bwrap(tmp_path / "bin"))  # this machine without bubblewrap
    (pytester.path / "cands" / "scale").mkdir(parents=True)
    replay = f"replay:{pytester.path / 'cands'}"
    result = run_optimize(pytester, "--kope-agent", replay)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: --kope-agent replay writes untrusted code, which runs only in the bubblewrap jail, but "
            "here bubblewrap is not installed: install it (apt-get install bubblewrap) or pass "
            "--kope-allow-unjailed to run candidates without it"
        ]
    )
    # the user may say otherwise, on the command line or in the ini file
    for allow in (["--kope-allow-unjailed"], ["-o", "kope_allow_unjailed=true"]):
        result = run_optimize(pytester, "--kope-agent", replay, *allow, "--collect-only", "-q")
        assert result.ret == 0, result.stderr.str()
    # the tuner only rebuilds the committed source: it runs unjailed, and the header says so once
    result = run_optimize(pytester, "--kope-agent", "tuner", "--kope-budget", "1", "--kope-no-commit")
    assert result.ret == 0, result.stdout.str()
    header = [line for line in result.stdout.lines if "bubblewrap" in line]
    assert len(header) == 1 and "no network/filesystem jail" in header[0], header
