"""Where pytest-kope keeps its state: `.kope/` under the pytest rootdir, which ignores itself."""

from __future__ import annotations

from pathlib import Path

import pytest

GITIGNORE = "# written by pytest-kope: the experience graph, builds and run reports are local state\n*\n"


def kope_dir(config: pytest.Config) -> Path:
    """`.kope/` under the rootdir, created with its own .gitignore so `git status` stays clean."""
    path = Path(str(config.rootpath)) / ".kope"
    ensure_kope_dir(path)
    return path


def ensure_kope_dir(path: Path) -> Path:
    """The `.kope/` folder, created with its own .gitignore."""
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text(GITIGNORE)
    return path


def kope_home(rootdir: Path, sources: list[Path]) -> tuple[Path, str]:
    """Where a run keeps `.kope/` and finds git: pytest's rootdir when it holds the operators' sources
    (the usual case), else the git repository (or common folder) around the sources, with a warning.

    pytest picks its rootdir from the command line's paths before plugins parse their options, so a
    value typed as a separate word (`--kope-db /tmp/shared.db`) can make `/tmp` the rootdir.
    """
    root = rootdir.resolve()
    sources = [s.resolve() for s in sources]
    if not sources or all(s.is_relative_to(root) for s in sources):
        return root, ""
    import os

    common = Path(os.path.commonpath([str(s.parent) for s in sources]))
    top = next((d for d in (common, *common.parents) if (d / ".git").exists()), common)
    return top, (
        f"pytest's rootdir {root} does not hold the operators' sources (an option's value taken as a "
        f"path? write --kope-db=PATH): using {top} for .kope/ and git"
    )
