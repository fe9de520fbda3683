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
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text(GITIGNORE)
    return path
