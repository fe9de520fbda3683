"""What the controller knows of one operator's oracle: the judge's `Plan`, made once per operator
(`session/planning.py`) and read by every part of the judge that starts a child."""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...operator import Operator
from ...settings import DEFAULTS
from . import sandbox


@dataclass(kw_only=True, frozen=True)
class Plan:
    """What the controller knows of one operator's oracle (built by keywords: 24 fields), fixed once
    made: the run's share of the machine is given by `Concurrency.share`, which makes a new one."""

    operator: Operator
    rootdir: Path
    inifile: Path | None
    files: list[Path]
    correctness: list[str]  # base node ids
    performance: list[str]
    toolchain_env: dict[str, str] = field(default_factory=dict)
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    seeds: int = 2
    jobs: int = max(1, os.cpu_count() or 1)
    keep: Path | None = None  # where to keep each child's log and source (the run dir)
    devices: tuple[int, ...] = ()  # accelerator indices: one timing worker each; correctness spreads over all
    plugins: tuple[str, ...] = ()  # extra pytest plugins the operator's tests need (ini `kope_plugins`)
    ceilings: dict[str, Any] | None = None  # measured bandwidth/FMA ceilings, for host-timed kernels
    fork_server: bool = True  # judge in children forked from warm servers, built once (launch.py)
    min_gain: float = DEFAULTS["kope_min_gain"]  # the gain a paired timing must decide (`--kope-min-gain`)
    sequential: bool = True  # paired rounds stop once the 95% bound decides (else they run to the cap)
    record_inputs: bool = True  # fork servers run a perf test's body once and children reuse its inputs
    device_env_var: str | None = None  # the toolchain's variable that pins a child to one device
    jit_cache_env: str | None = None  # the toolchain's variable for its JIT cache (one per candidate)
    executor: Any = None  # where children run (`executors.py`): None judges on this machine
    node: Any = None  # a NodeReservation shared by operators judged concurrently on this machine
    timing_slots: queue.Queue[int | None] | None = None  # devices shared by those operators' timings
    jail_required: bool = False  # candidates of this run run only jailed (checked where they run)
    sanitize_env: str | None = None  # the toolchain's switch for a sanitized child (None: none is run)
