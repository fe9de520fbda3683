"""What the controller knows of one operator's oracle: the judge's `Plan`, made once per operator
(`session/planning.py`) and read by every part of the judge that starts a child."""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...operator import Operator
from ...settings import Settings
from . import sandbox


@dataclass(kw_only=True, frozen=True)
class Plan:
    """What the controller knows of one operator's oracle (built by keywords), fixed once
    made: the run's share of the machine is given by `Concurrency.share`, which makes a new one."""

    operator: Operator
    rootdir: Path
    inifile: Path | None
    files: list[Path]
    correctness: list[str]  # base node ids
    performance: list[str]
    toolchain_env: dict[str, str] = field(default_factory=dict)
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    settings: Settings = field(default_factory=Settings)  # the run's, carried whole into every request
    children: sandbox.Children = field(default_factory=sandbox.Children)  # the run's: what Ctrl-C kills
    jobs: int = max(1, os.cpu_count() or 1)
    keep: Path | None = None  # where to keep each child's log and source (the run dir)
    devices: tuple[int, ...] = ()  # accelerator indices: one timing worker each; correctness spreads over all
    plugins: tuple[str, ...] = ()  # extra pytest plugins the operator's tests need (ini `kope_plugins`)
    ceilings: dict[str, Any] | None = None  # measured bandwidth/FMA ceilings, for host-timed kernels
    device_env_var: str | None = None  # the toolchain's variable that pins a child to one device
    jit_cache_env: str | None = None  # the toolchain's variable for its JIT cache (one per candidate)
    executor: Any = None  # where children run (`executors.py`): None judges on this machine
    node: Any = None  # a NodeReservation shared by operators judged concurrently on this machine
    timing_slots: queue.Queue[int | None] | None = None  # devices shared by those operators' timings
    jail_required: bool = False  # candidates of this run run only jailed (checked where they run)
    sanitize_env: str | None = None  # the toolchain's switch for a sanitized child (None: none is run)

    def with_settings(self, **changes: Any) -> Plan:
        """This plan with some of its run's settings changed (the benches' modes, a test's)."""
        return replace(self, settings=replace(self.settings, **changes))
