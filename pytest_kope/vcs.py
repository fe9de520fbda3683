"""Commit verified winners to `kope/<op>` branches through a temporary worktree.

The user's working tree, index, HEAD and current branch are never touched: the commit is made in a
detached worktree on top of the commit the run started from, then the branch ref is moved to it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

WORKTREE_PREFIX = "kope-worktree-"
FALLBACK_AUTHOR = ("pytest-kope", "pytest-kope@localhost")


@dataclass(frozen=True)
class Committed:
    branch: str
    sha: str


class Vcs:
    """The git repository around the pytest rootdir, or None-like when there is none."""

    def __init__(self, repo: git.Repo):
        self.repo = repo
        self.top = Path(repo.working_tree_dir)
        self.base = repo.head.commit.hexsha  # the commit the run started from

    @classmethod
    def find(cls, path: Path) -> Vcs | None:
        try:
            repo = git.Repo(path, search_parent_directories=True)
            repo.head.commit  # noqa: B018 - raises on a repo with no commits
        except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
            return None
        return cls(repo)

    def prune_stale_worktrees(self) -> list[str]:
        """Remove worktrees a killed run left behind; returns their paths."""
        removed = []
        for block in self.repo.git.worktree("list", "--porcelain").split("\n\n"):
            line = block.splitlines()[0] if block.strip() else ""
            path = line.removeprefix("worktree ").strip()
            if WORKTREE_PREFIX in Path(path).name:
                self.repo.git.worktree("remove", "--force", path) if Path(path).exists() else None
                removed.append(path)
        self.repo.git.worktree("prune")
        return removed

    def is_dirty(self, path: Path) -> bool:
        rel = Path(path).resolve().relative_to(self.top.resolve())
        return bool(self.repo.git.status("--porcelain", "--", str(rel)).strip())

    def branch_trailers(self, branch: str) -> dict[str, str]:
        try:
            commit = self.repo.commit(branch)
        except (git.BadName, ValueError):
            return {}
        trailers = {}
        for line in commit.message.splitlines():
            key, sep, value = line.partition(": ")
            if sep and key.startswith("Kope-"):
                trailers[key] = value.strip()
        trailers["_parent"] = commit.parents[0].hexsha if commit.parents else ""
        return trailers

    def commit(self, branch: str, path: Path, text: str, message: str) -> Committed:
        """Commit `text` as `path` on top of the run's base commit and point `branch` at it."""
        rel = Path(path).resolve().relative_to(self.top.resolve())
        if self.repo.head.is_detached is False and self.repo.active_branch.name == branch:
            raise RuntimeError(
                f"branch {branch} is checked out here; switch away from it to let kope update it"
            )
        where = Path(tempfile.mkdtemp(prefix=WORKTREE_PREFIX))
        shutil.rmtree(where)
        self.repo.git.worktree("add", "--detach", str(where), self.base)
        try:
            wt = git.Repo(where)
            (where / rel).write_text(text)
            wt.git.add("--", str(rel))
            env = {}
            reader = self.repo.config_reader()
            if not reader.has_option("user", "email"):
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
            sha = wt.head.commit.hexsha
            wt.close()
        finally:
            self.repo.git.worktree("remove", "--force", str(where))
        self.repo.git.branch("-f", branch, sha)
        return Committed(branch, sha)
