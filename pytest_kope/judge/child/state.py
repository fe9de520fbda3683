"""What a process that runs the repo's tests learns while it runs, in one object its pytest run owns
(`ChildState`, in the config's stash: `of(config)`): the guards' switches and the calls they remember,
the time spent inside guarded calls, the builds that failed and what builds took, and the calls of a
perf test's body a fork server records. A plain run has one too, with every switch off."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import numpy as np

    from ...toolchains.base import KernelFunction

Recorded = list[tuple[str, tuple[Any, ...]]]  # a perf test body's kernel calls: (function, arguments)


@dataclass
class Switches:
    """How the guards run in this process: all off in a plain run, which pays nothing for them."""

    probe: bool = False  # a judging child: results must follow the data, not the buffers' addresses
    # In a correctness child whose differential replay follows, the tests' calls are not waited on one
    # by one (2 ms each, a sixth of a small operator's correctness run): the replay makes the same calls
    # and checks that every output settled, with one wait (`guards.SettleLater`).
    settled_in_replay: bool = False
    recorder: Callable[[KernelFunction, tuple[Any, ...], dict[int, Any]], None] | None = None


@dataclass
class ChildState:
    """One process's judging state; set from its request once (`child/plugin.py`), read by the guards,
    the build and the fork server's recording."""

    switches: Switches = field(default_factory=Switches)
    # wall time inside guarded calls (guards and kernel): what a test body spent beyond it is the test's
    # own code (inputs, references, asserts), which a judging child reports apart from the judge's checks
    called_s: float = 0.0
    # the address probe's last call of each shape: (inputs, outputs) by argument index
    last_calls: dict[tuple[Any, ...], tuple[dict[int, np.ndarray], dict[int, np.ndarray]]] = field(
        default_factory=dict
    )
    failed_builds: dict[str, tuple[str, str]] = field(default_factory=dict)  # hash -> (kind, message)
    build_seconds: list[float] = field(default_factory=list)  # each build's (or cache load's) wall time
    recording: Recorded | None = None  # the calls of the body a fork server is recording, while it runs
    kept: dict[tuple[str, int], Recorded | None] = field(default_factory=dict)  # (item, seed) -> calls


STATE = pytest.StashKey[ChildState]()


def of(config: pytest.Config) -> ChildState:
    """The run's state, made on first use."""
    if STATE not in config.stash:
        config.stash[STATE] = ChildState()
    return config.stash[STATE]
