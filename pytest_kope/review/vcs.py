"""Commit verified winners to `kope/<op>` branches through a temporary worktree; fetch and push them.

The user's working tree, index, HEAD and current branch are never touched: the commit is made in a
detached worktree, then the branch ref is moved with a compare-and-swap (`git update-ref NEW OLD`).
No commit is ever lost: a branch only moves forward. Where `kope/<op>` already exists (here or on the
remote) the winner goes on top of its tip when the run's base still applies to it, else to
`kope/<op>-<run-id>` (see `Vcs.plan`). Concurrent runs on one repo serialize their git steps on a lock
file in the git dir, and each keeps its worktree under a lock of its own, so one run never prunes
another's live worktree.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import git

WORKTREE_PREFIX = "kope-worktree-"
FALLBACK_AUTHOR = ("pytest-kope", "pytest-kope@localhost")
ZERO = "0" * 40


@dataclass(frozen=True)
class Committed:
    """A winner committed: the branch, the commit and what was moved aside."""

    branch: str
    sha: str
    parent: str  # the commit it was made on: the branch's old tip, or the run's base
    moved_aside: str = ""  # why it went to <branch>-<run-id> after all (the branch moved meanwhile)


@dataclass(frozen=True)
class Target:
    """Where a winner goes: `branch` on top of `parent`; `old` is the ref's value the move expects."""

    branch: str
    parent: str
    old: str  # ZERO: the ref must not exist yet
    note: str  # "" for a plain new branch or a branch of our own; else the sentence the run says
    remote_tip: str | None  # the remote's tip of `branch` as fetched (the push lease), None: absent


@dataclass(frozen=True)
class Pushed:
    """A push of a branch: whether it went through, and what git said."""

    ok: bool
    detail: str


class Vcs:
    """The git repository around the pytest rootdir."""

    def __init__(self, repo: git.Repo):
        self.repo = repo
        if repo.working_tree_dir is None:  # a bare repository: no working tree to commit from
            raise TypeError("a bare git repository has no working tree")
        self.top = Path(repo.working_tree_dir)
        self.base = repo.head.commit.hexsha  # the commit the run started from
        self.common = Path(repo.common_dir)
        self.held: dict[str, int] = {}  # worktree name -> fd of its lock

    @classmethod
    def find(cls, path: Path) -> Vcs | None:
        try:
            repo = git.Repo(path, search_parent_directories=True)
            repo.head.commit  # noqa: B018 - raises on a repo with no commits
        except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
            return None
        return cls(repo)

    # -- locks -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, say: Callable[[str], None] = lambda line: None) -> Iterator[None]:
        """Hold the repo's kope lock (other kope runs wait; plain git is not blocked)."""
        fd = os.open(self.common / "kope.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"kope: waiting for another kope run's git step to finish (lock {self.common}/kope.lock)")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _worktree_lock(self, name: str) -> Path:
        folder = self.common / "kope-worktrees"
        folder.mkdir(exist_ok=True)
        return folder / f"{name}.lock"

    def prune_stale_worktrees(self) -> list[str]:
        """Remove worktrees a killed run left behind (their lock is free); returns their paths.
        Writes nothing into the git dir when there is no kope worktree at all."""
        removed: list[str] = []
        paths = [
            block.splitlines()[0].removeprefix("worktree ").strip()
            for block in self.repo.git.worktree("list", "--porcelain").split("\n\n")
            if block.strip()
        ]
        mine = [p for p in paths if WORKTREE_PREFIX in Path(p).name and Path(p).name not in self.held]
        if not mine:
            self.repo.git.worktree("prune")
            return removed
        with self.locked():
            for path in mine:
                lock = self._worktree_lock(Path(path).name)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)  # a live run holds it
                    continue
                try:
                    if Path(path).exists():
                        self.repo.git.worktree("remove", "--force", path)
                    removed.append(path)
                    lock.unlink(missing_ok=True)
                finally:
                    os.close(fd)
            self.repo.git.worktree("prune")
            self._tidy_locks()
        return removed

    def _tidy_locks(self) -> None:
        with contextlib.suppress(OSError):
            (self.common / "kope-worktrees").rmdir()  # only when empty

    # -- reading -----------------------------------------------------------------------------------
    def is_dirty(self, path: Path) -> bool:
        rel = Path(path).resolve().relative_to(self.top.resolve())
        return bool(self.repo.git.status("--porcelain", "--", str(rel)).strip())

    def rev(self, ref: str) -> str | None:
        try:
            sha: str = self.repo.git.rev_parse("--verify", "-q", f"{ref}^{{commit}}")
            return sha
        except git.GitCommandError:
            return None

    def is_ancestor(self, older: str, newer: str) -> bool:
        try:
            self.repo.git.merge_base("--is-ancestor", older, newer)
            return True
        except git.GitCommandError:
            return False

    def checked_out(self, branch: str) -> bool:
        listing = self.repo.git.worktree("list", "--porcelain")
        return f"branch refs/heads/{branch}" in listing.splitlines()

    def trailers(self, sha: str) -> dict[str, str]:
        found: dict[str, str] = {}
        message = self.repo.commit(sha).message  # str: GitPython decodes it (bytes in its types only)
        text = message if isinstance(message, str) else message.decode("utf-8", "replace")
        for line in text.splitlines():
            key, sep, value = line.partition(": ")
            if sep and key.startswith("Kope-"):
                found[key] = value.strip()
        return found

    def latest_kope_commit(self, tip: str) -> dict[str, str]:
        """The trailers of the newest kope commit on `tip` that the run's base does not hold
        (reviewers' commits skipped); {} when there is none."""
        for sha in self.repo.git.rev_list(tip, f"^{self.base}").split():
            found = self.trailers(sha)
            if "Kope-Candidate" in found:
                parents = self.repo.commit(sha).parents
                return {**found, "_sha": sha, "_parent": parents[0].hexsha if parents else ""}
        return {}

    def changed_between(self, old: str, new: str, paths: Sequence[Path]) -> list[str]:
        rels = [str(Path(p).resolve().relative_to(self.top.resolve())) for p in paths]
        names: str = self.repo.git.diff("--name-only", old, new, "--", *rels)
        return names.split()

    def foreign_commits(self, since: str, tip: str) -> list[str]:
        """Commits in since..tip that pytest-kope did not make (reviewers' fix-ups)."""
        shas = self.repo.git.rev_list(f"{since}..{tip}").split()
        return [s for s in shas if "Kope-Candidate" not in self.trailers(s)]

    # -- deciding where a winner goes ----------------------------------------------------------------
    def plan(self, branch: str, run_id: str, paths: Sequence[Path], remote: str | None) -> Target:
        """Where a winner judged on the run's base goes, without ever dropping a commit.

        The tip is the local branch, or the remote's when that is ahead (a fresh CI clone builds on
        what reviewers see). The winner goes on top of the tip when the base still applies: the tip
        descends from the base, or the operator's files (kernel and tests) are the same at the tip's
        fork point as at the base. Otherwise, or when local and remote have diverged, or the branch is
        checked out somewhere, it goes to `<branch>-<run_id>` on the base."""
        local = self.rev(f"refs/heads/{branch}")
        theirs = self.rev(f"refs/remotes/{remote}/{branch}") if remote else None
        side = f"{branch}-{run_id}"
        tip, why = local or theirs, ""
        if local and theirs and local != theirs:
            if self.is_ancestor(local, theirs):
                tip = theirs
            elif not self.is_ancestor(theirs, local):
                tip, why = None, f"{branch} here and on {remote} have diverged"
        if tip is None and not why:
            return Target(branch, self.base, ZERO, "", None)
        if tip is not None and self.checked_out(branch):
            tip, why = None, f"{branch} is checked out in a worktree"
        if tip is not None and not self.is_ancestor(self.base, tip):
            fork = self.repo.git.merge_base(self.base, tip)
            changed = self.changed_between(fork, self.base, paths)
            if changed:
                tip, why = (
                    None,
                    (f"{branch} was built on {fork[:10]}, and {', '.join(changed)} changed since then"),
                )
        if tip is None:
            old = self.rev(f"refs/heads/{side}") or ZERO
            return Target(side, self.base, old, f"{why}: the winner is on {side} instead", None)
        note = ""
        foreign = self.foreign_commits(self.base, tip) if self.is_ancestor(self.base, tip) else []
        if foreign or not self.is_ancestor(self.base, tip):
            whose = f"{len(foreign)} commit(s) not made by pytest-kope" if foreign else "an older base"
            note = f"{branch} has {whose}; the winner is committed on top of {tip[:10]}, keeping them"
        return Target(branch, tip, local or ZERO, note, theirs)

    # -- writing -----------------------------------------------------------------------------------
    def commit(self, target: Target, path: Path, text: str, message: str, run_id: str) -> Committed:
        """Commit `text` as `path` on top of `target.parent`, then move the branch from `target.old`
        (compare-and-swap: a ref someone else moved meanwhile is left alone)."""
        rel = Path(path).resolve().relative_to(self.top.resolve())
        where = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX + f"{os.getpid()}-"))
        name = where.name
        fd = os.open(self._worktree_lock(name), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held while the worktree lives: no other run prunes it
        self.held[name] = fd
        shutil.rmtree(where)
        try:
            self.repo.git.worktree("add", "--detach", str(where), target.parent)
            try:
                sha = self._commit_in(where, rel, text, message)
            finally:
                self.repo.git.worktree("remove", "--force", str(where))
        finally:
            self._worktree_lock(name).unlink(missing_ok=True)
            os.close(self.held.pop(name))
            self._tidy_locks()
        try:
            self._move(target.branch, sha, target.old)
        except git.GitCommandError:  # the branch moved meanwhile: leave it alone, keep the commit beside it
            aside = f"{target.branch}-{run_id}"
            self._move(aside, sha, self.rev(f"refs/heads/{aside}") or ZERO)
            return Committed(aside, sha, target.parent, f"{target.branch} moved while this run committed")
        return Committed(target.branch, sha, target.parent)

    def _move(self, branch: str, sha: str, old: str) -> None:
        self.repo.git.update_ref("-m", "pytest-kope: verified winner", f"refs/heads/{branch}", sha, old)

    def _commit_in(self, where: Path, rel: Path, text: str, message: str) -> str:
        wt = git.Repo(where)
        try:
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            (where / rel).write_text(text)
            wt.git.add("--", str(rel))
            env = {}
            if not self.repo.config_reader().has_option("user", "email"):
                env = {
                    "GIT_AUTHOR_NAME": FALLBACK_AUTHOR[0],
                    "GIT_AUTHOR_EMAIL": FALLBACK_AUTHOR[1],
                    "GIT_COMMITTER_NAME": FALLBACK_AUTHOR[0],
                    "GIT_COMMITTER_EMAIL": FALLBACK_AUTHOR[1],
                }
            with tempfile.NamedTemporaryFile("w", suffix=".msg", delete=False) as f:
                f.write(message)
            try:
                wt.git.commit("--no-verify", "-q", "-F", f.name, env=env)
            finally:
                os.unlink(f.name)
            return wt.head.commit.hexsha
        finally:
            wt.close()

    # -- the remote --------------------------------------------------------------------------------
    def fetch(self, remote: str, prefix: str, env: Mapping[str, str]) -> str | None:
        """Fetch the remote's `<prefix>*` branches into refs/remotes/<remote>/; the error, or None."""
        spec = f"+refs/heads/{prefix}*:refs/remotes/{remote}/{prefix}*"
        status, _, err = self.repo.git.fetch(
            "--prune",
            "--quiet",
            remote,
            spec,
            env=_quiet(env),
            with_extended_output=True,
            with_exceptions=False,
        )
        return _last_lines(err) or f"git fetch exited {status}" if status else None

    def push(self, remote: str, branch: str, sha: str, lease: str | None, env: Mapping[str, str]) -> Pushed:
        """Push `sha` to the remote's `branch`, only if the remote still has `lease` there (None: no
        such branch yet). Never a force over commits this run did not read: `sha` descends from it."""
        if lease is not None and not self.is_ancestor(lease, sha):
            return Pushed(False, f"not pushed: {sha[:10]} does not descend from {remote}'s {lease[:10]}")
        ref = f"refs/heads/{branch}"
        status, out, err = self.repo.git.push(
            "--porcelain",
            f"--force-with-lease={ref}:{lease or ''}",
            remote,
            f"{sha}:{ref}",
            env=_quiet(env),
            with_extended_output=True,
            with_exceptions=False,
        )
        if status:
            why = _porcelain_reason(out, ref) or _last_lines(err) or f"git push exited {status}"
            return Pushed(False, f"push of {branch} to {remote} rejected: {why}")
        return Pushed(True, f"pushed {branch} ({sha[:10]}) to {remote}")


def _quiet(env: Mapping[str, str]) -> dict[str, str]:
    return {"GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never", **env}


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return "; ".join(lines[-n:])


def _porcelain_reason(stdout: str, ref: str) -> str:
    """The summary git's --porcelain gives for `ref`: "[rejected] (stale info)", "[remote rejected] ..."."""
    for line in (stdout or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[1].endswith(f":{ref}"):
            return parts[2].strip()
    return ""
