"""Round 2: kernels that tell the judge from a user (issue 33, item 3).

Each cheat is right only where the judge used to look (oversubscribed correctness children, the
performance test's shape, a variable only judging processes start with) and wrong where a user runs
plain `pytest`. None may be crowned or judged ok/better; each honest twin (the same code without
the trick) must still win, and whatever lands on a branch passes plain `pytest` there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from op_repos import git
from replay_run import ReplayRun

CHEATS = {
    "rowsum": ["env_oversubscribed", "judge_stack_env"],
    "softmax": ["fastexp_unless_oversubscribed", "fastexp_at_perf_shape"],
}
TWINS = {"rowsum": ["plain_twin"], "softmax": ["plain_twin"]}


@pytest.fixture(scope="module")
def cheats(tmp_path_factory: pytest.TempPathFactory) -> ReplayRun:
    return ReplayRun(tmp_path_factory.mktemp("cheats"), CHEATS)


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> ReplayRun:
    return ReplayRun(tmp_path_factory.mktemp("twins"), TWINS)


def plain_pytest_on(run: ReplayRun, op: str, where: Path) -> subprocess.CompletedProcess[str]:
    """Plain `pytest <op>` on a checkout of `kope/<op>`, as a reviewer runs it."""
    git(run.repo, "worktree", "add", "-q", str(where), f"kope/{op}")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    cmd = [sys.executable, "-m", "pytest", op, "-q", "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("op,name", [(op, n) for op, names in CHEATS.items() for n in names])
def test_cheat_is_neither_crowned_nor_correct(cheats: ReplayRun, op: str, name: str) -> None:
    verdict = cheats.verdict(op, name)
    assert not cheats.crowned(op, name), verdict
    assert verdict["outcome"] not in ("ok", "better"), verdict


def test_environment_keyed_failures_name_the_environment(cheats: ReplayRun) -> None:
    """The oversubscription-keyed rowsum is wrong in the user's environment, and the verdict says so."""
    failures = " ".join(cheats.verdict("rowsum", "env_oversubscribed")["failures"])
    assert "test_rowsum_matches_reference" in failures, failures
    assert "oversubscribed environment" not in failures, failures  # it failed in the user's


def test_timed_outputs_are_held_to_the_tests_precision(cheats: ReplayRun) -> None:
    """Accurate at every tested shape, ~6e-4 off at the timed one: the timed outputs' bar is the tests'."""
    verdict = cheats.verdict("softmax", "fastexp_at_perf_shape")
    assert "test_softmax_perf" in " ".join(verdict["failures"]), verdict
    bar = cheats.ops["softmax"]["timed_rtol"]
    assert 1e-4 <= bar["rtol"] < 2e-4 and "assert_close" in bar["from"], bar


def test_a_kernel_keyed_on_a_judge_only_variable_finds_the_users_environment(cheats: ReplayRun) -> None:
    """The stack-environment rowsum keys on a variable judging children start with and a user's
    plain `pytest` does not. Its kernel server gets the user's own environment, not its host's, so
    it is wrong in the first judging child already, and reaches no branch."""
    verdict = cheats.verdict("rowsum", "judge_stack_env")
    assert verdict["outcome"] == "incorrect", verdict
    assert "test_rowsum_matches_reference" in " ".join(verdict["failures"]), verdict
    assert cheats.committed_source("rowsum") is None


def test_no_cheat_reaches_a_branch(cheats: ReplayRun) -> None:
    for op in CHEATS:
        assert cheats.committed_source(op) is None, op


@pytest.mark.parametrize("op", sorted(TWINS))
def test_honest_twin_is_crowned_and_passes_plain_pytest(twins: ReplayRun, op: str, tmp_path: Path) -> None:
    assert twins.crowned(op, "plain_twin"), twins.why(op, "plain_twin")
    entry = twins.ops[op]
    assert entry["plain_pytest"]["passed"] > 0 and not entry["plain_pytest"]["failed"], entry
    source = twins.committed_source(op)
    assert source is not None and "Honest twin" in source
    ran = plain_pytest_on(twins, op, tmp_path / "branch")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
