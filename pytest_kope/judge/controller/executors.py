"""Where a judging child runs: on this machine (the default), or on a worker node of another engine.

The seam is one method, `Executor.judge(plan, spec, key, work, timing) -> Ran`: the controller has
drawn the signing key and written the child's spec (`launch.py`); an executor runs the *same* fresh
judging child (`Launcher.run_fresh`: rlimits, bubblewrap jail, scrubbed environment) on some node and
sends back what the child wrote (`Ran`). The controller then reads the signed events and decides the
verdict exactly as for a local child, so a worker decides nothing and writes neither graph nor git.

The local executor needs no object here: `Plan.executor` is None and `Launcher` judges in children of
this process (fork servers or fresh). `ray_executor.py` is the other executor; this module holds what
is not Ray's: the job a worker gets, what it sends back, and the worker's side (`judge_on_this_node`,
plain Python, run inside a Ray task). The seam's types (`Executor`, `Ran`) are in plan.py, beside the `Plan`
that holds the executor.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..request import JudgeRequest
from . import environments
from .plan import Ran
from .sandbox import HOST_ENV, KEEP, Finished

if TYPE_CHECKING:
    from .plan import Plan


# What a worker's own environment says about its node: its paths, locale, installed toolkits and the
# devices Ray assigned it. Every other variable a judging child keeps decides how a judgement is done,
# so it travels with the job from the controller and a worker judges as this machine would: those of
# sandbox.KEEP (the compiler, OpenMP threads, ...) as `Job.env`, and the toolchain's own
# (`Toolchain.passed_env()` and `environment()`: the screening switch, the Ascend chip, ...) in the
# plan's `toolchain_env`, less the node's own, which the worker takes from its environment
# (`Job.node_env`).
NODE_OWN = frozenset(
    {
        *HOST_ENV,
        "CUDA_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
        "ASCEND_HOME_PATH",
        "ASCEND_TOOLKIT_HOME",
        "ASCEND_OPP_PATH",
        "ASCEND_AICPU_PATH",
    }
)
SHIPPED_ENV = tuple(name for name in KEEP if name not in NODE_OWN)
# What a child leaves in its work folder that the controller reads: its events, its log, the
# differential check's outputs and, for the committed kernel, its recorded calls.
SENT_BACK = ("results.jsonl", "child.log", "replayed", "recorded")


@dataclass
class Job:
    """One judgement as a worker receives it (pickled): the plan without this process's objects, the
    spec with this machine's paths, which the worker moves to its own."""

    plan: Plan
    spec: dict[str, Any]  # the JudgeRequest as it travels (`JudgeRequest.to_json`)
    key: bytes
    work: str  # the controller's work folder: the spec's paths under it move to the worker's
    timing: bool
    env: dict[str, str]  # SHIPPED_ENV as the controller has it
    node_env: tuple[str, ...]  # the toolchain's variables the worker takes from its own environment
    shipped: bool  # the operator repo came as Ray's working_dir (the worker's cwd), else a shared path


def shipped_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The controller's values of SHIPPED_ENV (sandbox.KEEP less the node's own) that are set."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in SHIPPED_ENV if k in env}


def collect(work: Path) -> dict[str, bytes]:
    """The SENT_BACK files of a child's work folder (regular files only, no links)."""
    found: dict[str, bytes] = {}
    for name in SENT_BACK:
        path = work / name
        paths = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for p in paths:
            if p.is_file() and not p.is_symlink():
                found[p.relative_to(work).as_posix()] = p.read_bytes()
    return found


def judge_on_this_node(job: Job, replay: dict[str, bytes] | None) -> Ran:
    """The worker's side: run the job's child fresh in the sandbox here, return what it wrote.

    `replay`: the committed kernel's recorded calls (inputs and manifest), for the differential
    check; written to a folder of their own, read-only to the child like everything outside its work.
    """
    from .launch import Launcher
    from .sandbox import bubblewrap

    jail, why = bubblewrap()
    if job.plan.jail_required and jail is None:  # an error of this node: the task is tried elsewhere
        raise RuntimeError(f"node {socket.gethostname()} cannot jail this run's candidates: {why}")
    base = Path(tempfile.mkdtemp(prefix="kope-node-"))
    try:
        work = base / "work"
        work.mkdir()
        moves = {job.work: str(work)}
        if job.shipped:
            moves[str(job.plan.rootdir)] = os.getcwd()
        if replay is not None and job.spec.get("replay"):
            folder = base / "replay"
            Ran(Finished(0, False, 0.0, ""), replay, (0.0, 0.0)).unpack(folder)
            moves[str(job.spec["replay"])] = str(folder)
        spec = JudgeRequest.from_json(moved(job.spec, moves))
        plan = moved_plan(job.plan, moves)
        launcher = Launcher(plan)
        launcher.fresh_processes()
        own = {k: os.environ[k] for k in job.node_env if k in os.environ}
        environment = spec.environment
        made = launcher.child_env(work, None, environment, cached=False, sanitize=spec.sanitize)
        env = {**made, **job.env, **own}
        env.update(environments.settings(environment, env))  # oversubscribed over the shipped thread count
        began = time.monotonic()
        finished = launcher.run_fresh(spec, env, job.key, work, None)
        ended = time.monotonic()
        return Ran(finished, collect(work), (began, ended), node=socket.gethostname())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def moved(value: Any, moves: Mapping[str, str]) -> Any:
    """`value` with every string path under a key of `moves` moved under its value (JSON-like data)."""
    if isinstance(value, str):
        for old, new in moves.items():
            if value == old or value.startswith(old.rstrip("/") + "/"):
                return new + value[len(old) :]
        return value
    if isinstance(value, Path):
        return Path(moved(str(value), moves))
    if isinstance(value, list):
        return [moved(v, moves) for v in value]
    if isinstance(value, tuple):
        return tuple(moved(v, moves) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, moves) for k, v in value.items()}
    return value


def moved_plan(plan: Plan, moves: Mapping[str, str]) -> Plan:
    """The plan's paths (repo root, ini file, test files, toolchain environment) on the worker."""
    return replace(
        plan,
        rootdir=moved(plan.rootdir, moves),
        inifile=moved(plan.inifile, moves),
        files=moved(plan.files, moves),
        toolchain_env=moved(plan.toolchain_env, moves),
    )


def for_worker(plan: Plan) -> Plan:
    """The plan as a job carries it: without this process's executor, reservation, timing slots and run
    folder, and without the node's own variables in the toolchain's environment (`node_env`)."""
    env = {k: v for k, v in plan.toolchain_env.items() if k not in NODE_OWN and k != plan.device_env_var}
    return replace(plan, executor=None, node=None, timing_slots=None, keep=None, toolchain_env=env)


def node_env(plan: Plan) -> tuple[str, ...]:
    """The toolchain's variables a worker sets from its own environment: its toolkit paths, and the
    devices Ray assigned it (never the controller's)."""
    names = [k for k in plan.toolchain_env if k in NODE_OWN]
    if plan.device_env_var and plan.device_env_var not in names:
        names.append(plan.device_env_var)
    return tuple(names)
