"""Process-wide keys every floor needs: the run's seed, built kernels, the bench session.

They live here, at the bottom of the import order, so that the judging child and the builder never
import `plugin.py` (which would close an import circle through the workflow).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .judge.bench import BenchSession

SEED = pytest.StashKey[int]()
BENCH = pytest.StashKey["BenchSession"]()
BUILT = pytest.StashKey[dict[str, Any]]()


def bench_session(config: pytest.Config) -> BenchSession:
    """The process's timing records (and, in a judging child, the reference kernel)."""
    if BENCH not in config.stash:
        from .judge.bench import BenchSession

        config.stash[BENCH] = BenchSession()
    return config.stash[BENCH]
