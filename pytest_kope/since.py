"""`--kope-since REF`: tune only the operators whose kernel source or test modules changed since REF
(committed or not), plus any operator `-k` names, so a merge to main tunes what it touched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import git

from .errors import ConfigError
from .operator import operator_of


def changed_since(root: Path, ref: str) -> set[Path]:
    """Files that differ between REF and the working tree, as absolute paths."""
    try:
        repo = git.Repo(root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ConfigError(f"--kope-since {ref}: {root} is not in a git repository") from None
    try:
        repo.git.rev_parse("--verify", "-q", f"{ref}^{{commit}}")
    except git.GitCommandError:
        raise ConfigError(
            f"--kope-since {ref}: git knows no such commit in {repo.working_tree_dir}; a shallow CI clone "
            "needs more history (actions/checkout with fetch-depth: 0, GIT_DEPTH: 0 on GitLab)"
        ) from None
    top = Path(repo.working_tree_dir or root)
    names = repo.git.diff("--name-only", ref, "--").splitlines()
    return {(top / n).resolve() for n in names if n}


def _groups(items: Sequence[Any]) -> dict[str, tuple[Any, list[Any]]]:
    groups: dict[str, tuple[Any, list[Any]]] = {}
    for item in items:
        op = operator_of(item)
        if op is not None:
            groups.setdefault(op.name, (op, []))[1].append(item)
    return groups


def select(
    root: Path,
    ref: str,
    before: Sequence[Any],
    after: Sequence[Any],
    keyword_given: bool,
    deselect: Callable[[list[Any]], None],
) -> tuple[list[Any], str]:
    """The items to optimize and one line saying what was chosen and why.

    `before` is the collection before -k/-m deselection, `after` what is left. Without -k, the
    operators left are narrowed to the changed ones; with -k, the changed ones are added in full."""
    changed = changed_since(root, ref)
    everything = _groups(before)
    why: dict[str, list[str]] = {}
    for name, (op, items) in everything.items():
        files = {Path(op.source).resolve(), *(Path(str(i.path)).resolve() for i in items)}
        hits = sorted(
            str(f.relative_to(Path(root).resolve())) if f.is_relative_to(Path(root).resolve()) else str(f)
            for f in files & changed
        )
        if hits:
            why[name] = hits
    left = _groups(after)
    keep = set(why) | (set(left) if keyword_given else set())
    chosen = [i for i in after if (op := operator_of(i)) is None or op.name in keep]
    dropped = [i for i in after if (op := operator_of(i)) is not None and op.name not in keep]
    for name in why:
        if name not in left:  # changed, but -k left none of its tests: tune it in full
            chosen += everything[name][1]
    if dropped:
        deselect(dropped)
    tuned = [f"{n} ({', '.join(why[n])} changed)" if n in why else f"{n} (named by -k)" for n in sorted(keep)]
    unchanged = sorted(set(everything) - keep)
    line = f"kope: --kope-since {ref}: tuning {', '.join(tuned) or 'no operator'}"
    if unchanged:
        line += f"; unchanged, left alone: {', '.join(unchanged)}"
    return chosen, line
