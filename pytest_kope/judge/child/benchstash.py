"""Where a pytest process keeps its timing records (`BenchSession`): a key of the config's stash.

Apart from `bench.py` so that the plugin can look without importing the timing code (and numpy with it)
into every pytest process, and so that `bench.py` may read the run's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .bench import BenchSession

BENCH = pytest.StashKey["BenchSession"]()


def bench_session(config: pytest.Config) -> BenchSession:
    """The process's timing records (and, in a judging child, the reference kernel)."""
    if BENCH not in config.stash:
        from .bench import BenchSession

        config.stash[BENCH] = BenchSession()
    return config.stash[BENCH]
