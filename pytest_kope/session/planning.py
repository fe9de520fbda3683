"""The judge's `Plan` for one operator, made from the run's settings and the items pytest collected:
its tests (correctness and performance), limits, devices, ceilings and what its children need."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..errors import KopeError
from ..judge.controller import sandbox
from ..judge.controller.plan import Plan
from ..operator import is_performance_test
from ..toolchains import toolchain_of
from ..toolchains.base import Toolchain, judging_env
from .ceilings import measure_ceilings

if TYPE_CHECKING:
    from .run import OperatorRun, Run


def plan_for(s: Run, run: OperatorRun) -> tuple[Plan, Toolchain]:
    """What the judge needs to know of one operator: its tests, limits, devices and ceilings."""
    op = run.op
    tc = toolchain_of(s.config, op.toolchain)
    available = tc.availability()
    if not available.ok:
        raise KopeError(f"toolchain {tc.name} is unavailable here: {available.reason}")
    files = sorted({Path(str(i.path)) for i in run.items})
    correctness = [_nodeid(s, i) for i in run.items if not is_performance_test(i)]
    performance = [_nodeid(s, i) for i in run.items if is_performance_test(i)]
    if not correctness:
        raise KopeError(
            f"operator {op.name} has no correctness tests selected; nothing would judge a candidate"
        )
    devices = s.settings.device_indices()
    plan = Plan(
        operator=op,
        rootdir=s.home,
        inifile=Path(str(s.config.inipath)) if s.config.inipath else None,
        files=files,
        correctness=correctness,
        performance=performance,
        toolchain_env={**judging_env(tc), **_selection(s.config)},
        limits=sandbox.Limits(wall_s=s.settings.timeout, device=bool(tc.count_devices())),
        settings=s.settings,
        children=s.children,
        jobs=s.settings.jobs,
        keep=s.run_dir / op.name,
        devices=devices if devices is not None else tuple(range(tc.count_devices())),
        plugins=tuple(s.config.getini("kope_plugins")),
        ceilings=measure_ceilings(s.ceilings, tc),
        device_env_var=tc.device_env_var,
        jit_cache_env=tc.jit_cache_env,
        sanitize_env=None if op.own_build else tc.sanitize_env,  # a repo's own build takes no flags of ours
        jail_required=s.agent.needs_jail and not s.settings.allow_unjailed,
    )
    return s.concurrency.share(plan), tc  # the executor and node; timing devices shared by operators at once


def _selection(config: pytest.Config) -> dict[str, str]:
    """The run's toolchain choice, for judging children (they read the ini, not the command line)."""
    from ..toolchains import selected
    from ..toolchains.selection import ENV

    chosen = selected(config)
    return {ENV: ",".join(chosen)} if chosen else {}


def _nodeid(s: Run, item: pytest.Item) -> str:
    """The item's id as a judging child rooted at the run's home sees it (pytest's when they agree)."""
    if s.home == Path(str(s.config.rootpath)).resolve():
        return item.nodeid
    path = Path(str(item.path)).resolve().relative_to(s.home).as_posix()
    return f"{path}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else path
