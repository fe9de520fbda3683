"""What the controller knows of one operator's oracle: the judge's `Plan`, made once per operator
(`session/planning.py`) and read by every part of the judge that starts a child; and where its children
run: the `Executor` seam (executors.py, ray_executor.py), what a worker sends back (`Ran`), and this
machine as operators judged concurrently share it (`NodeReservation`)."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ...operator import Operator
from ...settings import Settings
from ..request import JudgeRequest
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
    executor: Executor | None = None  # where children run (`executors.py`): None judges on this machine
    node: NodeReservation | None = None  # shared by operators judged concurrently on this machine
    timing_slots: queue.Queue[int | None] | None = None  # devices shared by those operators' timings
    jail_required: bool = False  # candidates of this run run only jailed (checked where they run)
    sanitize_env: str | None = None  # the toolchain's switch for a sanitized child (None: none is run)

    def with_settings(self, **changes: Any) -> Plan:
        """This plan with some of its run's settings changed (the benches' modes, a test's)."""
        return replace(self, settings=replace(self.settings, **changes))


class Executor(Protocol):
    """Runs one judging child somewhere and returns what it wrote."""

    name: str

    def judge(self, plan: Plan, spec: JudgeRequest, key: bytes, work: Path, timing: bool) -> Ran:
        """Run the child `spec` asks for (paths in it are under `work` on this machine); raises
        `InfrastructureFault` when the machinery, not the child, failed."""
        ...

    def cpus(self) -> int:
        """The cores its workers have between them (the run's correctness workers)."""
        ...

    def describe(self) -> str:
        """One line for the run's header: where children run."""
        ...

    def require(self, plan: Plan) -> None:
        """Refuse (`ConfigError`) an operator this executor can never judge."""
        ...

    def close(self) -> None: ...


@dataclass
class Ran:
    """What a worker sends back: how the child ended, the files it left, when it ran (the node's clock)."""

    finished: sandbox.Finished
    files: dict[str, bytes]  # path relative to the work folder -> content (SENT_BACK only)
    clock: tuple[float, float]  # CLOCK_MONOTONIC of the worker's node, around the child
    node: str = ""
    notes: list[str] = field(default_factory=list)  # the executor's (retries), for the run's output

    def unpack(self, work: Path) -> None:
        """Write the files into `work` on this machine, refusing any path that would leave it."""
        root = work.resolve()
        for name, data in self.files.items():
            target = (work / name).resolve()
            if root not in target.parents:
                raise ValueError(f"a worker sent back a file outside its work folder: {name!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


class NodeReservation:
    """This machine as operators judged concurrently share it: a correctness child holds a share, a
    timing of a host-timed kernel holds it whole (so two timings, or a timing and a correctness run,
    never share cores). Waiting timings go first: correctness children arrive all the time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shares = 0
        self._whole = False
        self._waiting = 0  # timings waiting for the machine

    @contextmanager
    def share(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._whole and not self._waiting)
            self._shares += 1
        try:
            yield
        finally:
            with self._cond:
                self._shares -= 1
                self._cond.notify_all()

    @contextmanager
    def whole(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._whole and not self._shares)
            self._waiting -= 1
            self._whole = True
        try:
            yield
        finally:
            with self._cond:
                self._whole = False
                self._cond.notify_all()
