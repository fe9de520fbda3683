"""No commit is ever lost: real git repos, a bare remote in a tmp dir, clones and concurrent processes."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from forge_server import ForgeServer, forge_server_fixture  # noqa: F401
from op_repos import git

from pytest_kope.errors import ConfigError
from pytest_kope.review.forge import ForgeSettings, make_forge
from pytest_kope.review.prbase import pr_base
from pytest_kope.review.vcs import ZERO, Committed, Target, Vcs


def repo_with_remote(tmp_path: Path) -> tuple[Path, Path]:
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(remote))
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "op").mkdir()
    (work / "op" / "k.c").write_text("// kernel v1\n")
    (work / "op" / "test_k.py").write_text("# tests\n")
    (work / "README").write_text("readme\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "operators")
    git(work, "remote", "add", "origin", str(remote))
    git(work, "push", "-q", "origin", "main")
    return work, remote


def vcs_of(root: Path) -> Vcs:
    """The repository around `root` (every test here makes it with a first commit)."""
    vcs = Vcs.find(root)
    assert vcs is not None, root
    return vcs


def winner(
    vcs: Vcs, branch: str, text: str, run: str = "r1", remote: str | None = None
) -> tuple[Target, Committed]:
    files = [vcs.top / "op" / "k.c", vcs.top / "op" / "test_k.py"]
    target = vcs.plan(branch, run, files, remote)
    message = f"kope(op): winner {text}\n\nKope-Candidate: {text}\n"
    return target, vcs.commit(target, vcs.top / "op" / "k.c", text, message, run)


def log(root: Path, ref: str) -> list[str]:
    return git(root, "log", "--format=%s", ref).splitlines()


def test_a_reviewers_commit_survives_the_next_winner(tmp_path: Path) -> None:
    work, _ = repo_with_remote(tmp_path)
    vcs = vcs_of(work)
    target, first = winner(vcs, "kope/op", "v2")
    assert (target.parent, target.old, target.note) == (vcs.base, ZERO, "")
    git(work, "worktree", "add", "-q", str(tmp_path / "review"), "kope/op")  # a reviewer's fix-up
    (tmp_path / "review" / "NOTES").write_text("reviewed\n")
    git(tmp_path / "review", "add", "NOTES")
    git(tmp_path / "review", "commit", "-qm", "reviewer: notes")
    git(work, "worktree", "remove", str(tmp_path / "review"))
    reviewer = git(work, "rev-parse", "kope/op").strip()
    target, second = winner(vcs_of(work), "kope/op", "v3", "r2")
    assert target.parent == reviewer and "1 commit(s) not made by pytest-kope" in target.note
    assert log(work, "kope/op")[:3] == ["kope(op): winner v3", "reviewer: notes", "kope(op): winner v2"]
    assert git(work, "show", "kope/op:NOTES") == "reviewed\n"
    assert git(work, "show", "kope/op:op/k.c") == "v3"
    assert git(work, "rev-parse", "HEAD").strip() == vcs.base  # the checkout never moved
    assert first.sha in git(work, "rev-list", "kope/op")


def test_a_changed_kernel_on_main_sends_the_winner_beside_the_branch(tmp_path: Path) -> None:
    work, _ = repo_with_remote(tmp_path)
    winner(vcs_of(work), "kope/op", "v2")
    old_tip = git(work, "rev-parse", "kope/op").strip()
    (work / "README").write_text("changed\n")  # main moves on, the operator's files unchanged
    git(work, "commit", "-qam", "docs")
    target, done = winner(vcs_of(work), "kope/op", "v3", "r2")
    assert target.parent == old_tip and "older base" in target.note and done.branch == "kope/op"
    (work / "op" / "k.c").write_text("// kernel v1, fixed on main\n")  # now the kernel itself changed
    git(work, "commit", "-qam", "fix kernel")
    tip = git(work, "rev-parse", "kope/op").strip()
    target, done = winner(vcs_of(work), "kope/op", "v4", "r3")
    assert done.branch == "kope/op-r3" and "op/k.c changed since then" in target.note
    assert git(work, "rev-parse", "kope/op").strip() == tip  # left alone
    assert git(work, "rev-parse", "kope/op-r3~1").strip() == git(work, "rev-parse", "main").strip()


def test_a_branch_moved_meanwhile_is_left_alone(tmp_path: Path) -> None:
    work, _ = repo_with_remote(tmp_path)
    vcs = vcs_of(work)
    target = vcs.plan("kope/op", "r1", [work / "op" / "k.c"], None)
    git(work, "branch", "kope/op", "main")  # someone else made it between our read and our move
    done = vcs.commit(target, work / "op" / "k.c", "v2", "kope(op): v2\n\nKope-Candidate: v2\n", "r1")
    assert done.branch == "kope/op-r1" and "moved while this run committed" in done.moved_aside
    assert git(work, "rev-parse", "kope/op").strip() == vcs.base


def test_a_fresh_clone_builds_on_the_remotes_branch_and_pushes_with_a_lease(tmp_path: Path) -> None:
    work, remote = repo_with_remote(tmp_path)
    vcs = vcs_of(work)
    _, first = winner(vcs, "kope/op", "v2")
    assert vcs.push("origin", "kope/op", first.sha, None, {}).ok
    clone = tmp_path / "ci"
    git(tmp_path, "clone", "-q", str(remote), str(clone))  # CI: no local kope/* branches
    ci = vcs_of(clone)
    assert ci.fetch("origin", "kope/", {}) is None
    target, second = winner(ci, "kope/op", "v3", "r2", remote="origin")
    assert target.parent == first.sha and target.remote_tip == first.sha
    pushed = ci.push("origin", "kope/op", second.sha, target.remote_tip, {})
    assert pushed.ok, pushed.detail
    assert log(remote, "kope/op")[:2] == ["kope(op): winner v3", "kope(op): winner v2"]

    # A reviewer pushes meanwhile: the next push's lease is stale; it is refused and nothing is lost.
    reviewer = tmp_path / "reviewer"
    git(tmp_path, "clone", "-q", "-b", "kope/op", str(remote), str(reviewer))
    (reviewer / "NOTES").write_text("fix-up\n")
    git(reviewer, "add", "NOTES")
    git(reviewer, "commit", "-qm", "reviewer: fix-up")
    git(reviewer, "push", "-q", "origin", "kope/op")
    target, third = winner(vcs_of(clone), "kope/op", "v4", "r3", remote="origin")  # no fetch: stale
    pushed = ci.push("origin", "kope/op", third.sha, target.remote_tip, {})
    assert not pushed.ok and "rejected" in pushed.detail and "stale info" in pushed.detail
    assert log(remote, "kope/op")[0] == "reviewer: fix-up"
    # The next run fetches first, and builds on the reviewer's commit.
    assert ci.fetch("origin", "kope/", {}) is None
    target, fourth = winner(vcs_of(clone), "kope/op", "v5", "r4", remote="origin")
    assert done_on(fourth, target, clone) == "kope/op-r4"  # local (v4) and remote diverged: beside it
    assert "diverged" in target.note


def test_a_push_the_remote_refuses_is_reported(tmp_path: Path) -> None:
    work, remote = repo_with_remote(tmp_path)
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'branch protection: kope/* is read-only' >&2\nexit 1\n")
    hook.chmod(0o755)
    vcs = vcs_of(work)
    _, done = winner(vcs, "kope/op", "v2")
    pushed = vcs.push("origin", "kope/op", done.sha, None, {})
    assert not pushed.ok and "push of kope/op to origin rejected: [remote rejected]" in pushed.detail
    assert git(work, "rev-parse", "kope/op").strip() == done.sha  # the local commit stays


def done_on(done: Committed, target: Target, root: Path) -> str:
    assert git(root, "rev-parse", done.branch).strip() == done.sha
    return done.branch


LIVE = """
import sys
from pathlib import Path
from pytest_kope.review.vcs import Vcs
print(Vcs.find(Path(sys.argv[1])).prune_stale_worktrees())
"""


def test_pruning_leaves_another_runs_live_worktree_alone(tmp_path: Path) -> None:
    work, _ = repo_with_remote(tmp_path)
    vcs = vcs_of(work)
    live = tmp_path / "kope-worktree-live"
    dead = tmp_path / "kope-worktree-dead"
    git(work, "worktree", "add", "-q", "--detach", str(live))
    git(work, "worktree", "add", "-q", "--detach", str(dead))
    fd = os.open(vcs._worktree_lock(live.name), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a live run holds while its worktree exists
    try:
        out = subprocess.run(
            [sys.executable, "-c", LIVE, str(work)], capture_output=True, text=True, check=True
        ).stdout
        assert str(dead) in out and str(live) not in out
        assert live.exists() and not dead.exists()
    finally:
        os.close(fd)
    assert (
        str(live)
        in subprocess.run(
            [sys.executable, "-c", LIVE, str(work)], capture_output=True, text=True, check=True
        ).stdout
    )


RACE = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from pytest_kope.review.vcs import Vcs
    work, name = Path(sys.argv[1]), sys.argv[2]
    for i in range(5):
        vcs = Vcs.find(work)
        with vcs.locked(print):
            target = vcs.plan("kope/op", f"{name}{i}", [work / "op" / "k.c"], None)
            done = vcs.commit(target, work / "op" / "k.c", f"{name}{i}", f"{name}{i}\\n\\nKope-Candidate: {name}{i}\\n", f"{name}{i}")
        print(done.sha)
    """
)


@pytest.mark.parametrize("runs", [2])
def test_concurrent_runs_lose_no_commit(tmp_path: Path, runs: int) -> None:
    work, _ = repo_with_remote(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(work), f"run{n}-"], stdout=subprocess.PIPE, text=True
        )
        for n in range(runs)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    made = {line for out in outs for line in out.split() if len(line) == 40}
    assert len(made) == 5 * runs
    reachable = set(git(work, "rev-list", "--branches=kope/*").split())
    assert made <= reachable  # every commit either run made is on a kope/* branch
    assert not git(work, "branch", "--list", "kope/op-*").strip()  # the lock serialized them: one line
    assert len(git(work, "worktree", "list").splitlines()) == 1


# -- the pull request's target branch -----------------------------------------------------------------
def never_asked() -> str:
    raise AssertionError("the forge was asked, though git knew the answer")


def test_the_pull_requests_target_is_the_local_branchs_name_on_the_remote(tmp_path: Path) -> None:
    work, remote = repo_with_remote(tmp_path)
    git(work, "branch", "-m", "main", "master")
    git(work, "push", "-q", "-u", "origin", "master:main")  # master was pushed as main
    vcs = vcs_of(work)
    assert pr_base(vcs, "origin", None, {}, never_asked) == "main"
    assert pr_base(vcs, "origin", "release", {}, never_asked) == "release"  # ini kope_pr_base first
    git(work, "remote", "add", "fork", str(remote))
    git(work, "fetch", "-q", "fork")
    with pytest.raises(ConfigError):  # its upstream is on origin, not on the remote pushed to
        pr_base(vcs, "fork", None, {}, lambda: "")
    git(remote, "branch", "-m", "main", "trunk")  # the upstream went away on the remote
    git(work, "fetch", "-q", "--prune", "origin")
    assert "origin/main: gone" in git(work, "branch", "-vv")
    assert pr_base(vcs, "origin", None, {}, lambda: "trunk") == "trunk"


def test_the_remotes_default_branch_from_git_then_from_the_forge(
    tmp_path: Path, forge_server: ForgeServer
) -> None:
    work, _ = repo_with_remote(tmp_path)
    git(work, "branch", "-m", "main", "dev")  # no upstream, and the remote has no dev
    vcs = vcs_of(work)
    git(work, "remote", "set-head", "origin", "main")  # refs/remotes/origin/HEAD, as a clone has it
    assert pr_base(vcs, "origin", None, {}, never_asked) == "main"
    git(work, "remote", "set-head", "origin", "--delete")
    settings = ForgeSettings("github", forge_server.url, "acme/ops", forge_server.token, attempts=1)
    forge_server.default_branch = "trunk"
    assert pr_base(vcs, "origin", None, {}, make_forge(settings, print).default_branch) == "trunk"
    lab = ForgeSettings("gitlab", forge_server.url, "acme/ops", forge_server.token, attempts=1)
    assert pr_base(vcs, "origin", None, {}, make_forge(lab, print).default_branch) == "trunk"


def test_no_target_branch_is_one_line_naming_the_ini_option(
    tmp_path: Path, forge_server: ForgeServer
) -> None:
    work, _ = repo_with_remote(tmp_path)
    git(work, "branch", "-m", "main", "dev")
    vcs = vcs_of(work)
    bad = ForgeSettings("github", forge_server.url, "acme/ops", "ghp_not_it", attempts=1)
    with pytest.raises(ConfigError) as e:
        pr_base(vcs, "origin", None, {}, make_forge(bad, print).default_branch)
    message = str(e.value)
    assert "\n" not in message and "ghp_not_it" not in message
    assert message.startswith("--kope-pr: the pull request's target branch is unknown (dev has no upstream")
    assert "HTTP 401" in message and "origin has no branch dev" in message
    assert message.endswith("set ini kope_pr_base to a branch of origin")
    git(work, "push", "-q", "origin", "dev")  # now the remote has a branch of the local name
    assert pr_base(vcs, "origin", None, {}, make_forge(bad, print).default_branch) == "dev"
    git(work, "checkout", "-q", "--detach")
    detached = vcs_of(work)
    assert pr_base(detached, "origin", None, {"GITHUB_REF_NAME": "main"}, never_asked) == "main"
    with pytest.raises(ConfigError, match=r"HEAD is detached and \$GITHUB_BASE_REF.*kope_pr_base"):
        pr_base(detached, "origin", None, {}, lambda: "")
