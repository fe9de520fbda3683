"""The Ray executor (`--kope-executor ray`): each judgement is a Ray task that runs the same sandboxed
fresh child as the local executor, on whichever node Ray schedules it (`executors.py`).

Resources say what a judgement needs. A correctness run needs the toolchain and a core (`num_cpus=1`);
a timing needs a whole device of the operator's kind: `num_gpus=1` for CUDA, the custom resource `NPU`
for Ascend, and for kernels timed on the host CPU the whole node, through the custom resource
`kope_node` (1 per node): a timing takes all of it, a correctness run a sliver, so a timing never
shares a node's cores with another timing or a correctness run. A cluster for CPU operators is
started with `--resources '{"kope_node": 1}'` on every node; the local cluster started when no
`RAY_ADDRESS` is given declares it itself.

The operator repo reaches the workers as the task's `runtime_env` working dir (Ray uploads it once
per content, without `.git/` and `.kope/`), or, with `--kope-ray-repo shared`, at the same path on
every node (a shared file system). pytest-kope, pytest and the toolchain must be installed on every
worker, and bubblewrap where the jail is wanted: a Ray worker is not a sandbox, the child is.

A task lost to the machinery (its worker or node died, Ray could not run it) is submitted once more,
spread over the cluster; lost twice, it is an `InfrastructureFault`, never the candidate's crash.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, InfrastructureFault
from ...settings import EXECUTORS
from .executors import Job, for_worker, judge_on_this_node, node_env, shipped_env
from .plan import Executor, Ran

if TYPE_CHECKING:
    from ..request import JudgeRequest
    from .plan import Plan

NODE = "kope_node"  # the custom resource a CPU timing takes whole (1 per node)
CORRECTNESS_SHARE = 0.01  # of NODE (CPU), or of a device: many correctness runs fit beside each other
DEVICE_SHARE = 0.25
ATTEMPTS = 2  # a lost task is retried once
EXCLUDES = [".git/", ".kope/", "__pycache__/", ".pytest_cache/"]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--kope-executor ray needs Ray: pip install 'pytest-kope[ray]' (on the controller and every worker)"
        ) from None
    return ray


def _judge_task(job: Job, replay: dict[str, bytes] | None) -> Ran:
    """The Ray task: a fresh sandboxed child on this worker's node."""
    return judge_on_this_node(job, replay)


def device_kind(plan: Plan) -> str:
    """GPU, NPU or CPU: what a timing of this operator holds whole."""
    if not plan.limits.device:
        return "CPU"
    var = plan.device_env_var or ""
    return "NPU" if var.startswith("ASCEND") else "GPU"


def resources(plan: Plan, timing: bool) -> dict[str, Any]:
    """The Ray task options a judgement of `plan` needs (a timing: a whole device or node)."""
    kind = device_kind(plan)
    share = 1.0 if timing else DEVICE_SHARE
    if kind == "GPU":
        return {"num_cpus": 1, "num_gpus": share}
    if kind == "NPU":
        return {"num_cpus": 1, "resources": {"NPU": share}}
    return {"num_cpus": 1, "resources": {NODE: 1.0 if timing else CORRECTNESS_SHARE}}


class RayExecutor:
    """Judges each child as a Ray task on the cluster at $RAY_ADDRESS, or on a local one it starts."""

    name = "ray"

    def __init__(self, root: Path, ship: bool = True, address: str | None = None):
        """Connect to the cluster at `address` (default $RAY_ADDRESS), else start a local one. With
        `ship`, the repo at `root` becomes the job's working dir (Ray takes it only at connection)."""
        ray = self.ray = _ray()
        address = address or os.environ.get("RAY_ADDRESS") or None
        self.started = False  # whether this process started the cluster (then it stops it)
        self.ship = ship and not ray.is_initialized()  # a connection made elsewhere shares paths
        if not ray.is_initialized():
            shipped = {"working_dir": str(root), "excludes": EXCLUDES} if ship else None
            try:
                if address:
                    ray.init(
                        address=address, runtime_env=shipped, log_to_driver=False, configure_logging=False
                    )
                else:
                    ray.init(
                        resources={NODE: 1},
                        runtime_env=shipped,
                        include_dashboard=False,
                        log_to_driver=False,
                        configure_logging=False,
                    )
                    self.started = True
            except Exception as e:  # ConnectionError, a repo too big to ship, ...: Ray's message, one line
                where = f"the cluster at {address}" if address else "a local cluster"
                raise ConfigError(
                    f"--kope-executor ray: could not connect to {where}: {type(e).__name__}: {_first_line(e)}"
                    + (
                        "; or pass --kope-ray-repo shared (the repo at the same path on every node)"
                        if ship
                        else ""
                    )
                ) from None
        self.address = address or "a local cluster"
        self.task = ray.remote(_judge_task)
        self._replays: OrderedDict[str, Any] = OrderedDict()  # recorded-calls folder -> object in the store
        self._lock = threading.Lock()

    def describe(self) -> str:
        total = self.ray.cluster_resources()
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        what = ", ".join(f"{k} {v:g}" for k, v in sorted(total.items()) if k in ("CPU", "GPU", "NPU", NODE))
        repo = "shipped as the tasks' working dir" if self.ship else "at the same path on every node"
        return f"ray at {self.address}: {len(nodes)} node(s), {what}; operator repo {repo}"

    def cpus(self) -> int:
        return int(self.ray.cluster_resources().get("CPU", 1))

    def require(self, plan: Plan) -> None:
        """Refuse an operator whose timing the cluster can never schedule, instead of waiting forever."""
        need = resources(plan, timing=True)
        total = self.ray.cluster_resources()
        wanted = {**need.get("resources", {}), **({"GPU": need["num_gpus"]} if "num_gpus" in need else {})}
        for name, amount in wanted.items():
            if total.get(name, 0) < amount:
                how = (
                    f"start each node with --resources '{{\"{NODE}\": 1}}'"
                    if name == NODE
                    else f"no node of the cluster has a {name}"
                )
                raise ConfigError(
                    f"--kope-executor ray: timing {plan.operator.name} needs {name} {amount:g} on one node, "
                    f"the cluster at {self.address} has {total.get(name, 0):g}: {how}"
                )

    def judge(self, plan: Plan, spec: JudgeRequest, key: bytes, work: Path, timing: bool) -> Ran:
        ray = self.ray
        wire = spec.to_json()
        job = Job(for_worker(plan), wire, key, str(work), timing, shipped_env(), node_env(plan), self.ship)
        options: dict[str, Any] = {**resources(plan, timing), "max_retries": 0}
        replay = self._replay(spec.replay)
        lost: list[str] = []
        for attempt in range(1, ATTEMPTS + 1):
            ref = self.task.options(**options).remote(job, replay)
            try:
                ran: Ran = ray.get(ref)
            except ray.exceptions.RayError as e:
                lost.append(f"attempt {attempt}: {type(e).__name__}: {_first_line(e)}")
                options["scheduling_strategy"] = "SPREAD"  # elsewhere, where the cluster has another node
                continue
            ran.notes += [f"ray: {what}; judged again" for what in lost]
            return ran
        raise InfrastructureFault(f"the judgement was lost {ATTEMPTS} times on Ray: " + "; ".join(lost))

    def _replay(self, folder: str | None) -> Any:
        """The recorded calls as one object in Ray's store, put once per folder."""
        if not folder:
            return None
        with self._lock:
            if folder not in self._replays:
                root = Path(folder)
                files = {
                    p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
                }
                self._replays[folder] = self.ray.put(files)
                while len(self._replays) > 8:  # one per operator in flight; older folders are gone
                    self._replays.popitem(last=False)
            return self._replays[folder]

    def close(self) -> None:
        self._replays.clear()
        if self.ray.is_initialized():
            self.ray.shutdown()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""


def make_executor(name: str, root: Path, ship: bool = True) -> Executor | None:
    """None for `local` (judge on this machine); a `RayExecutor` connected for the repo at `root`."""
    if name == "local":
        return None
    if name == "ray":
        return RayExecutor(root, ship=ship)
    raise ConfigError(f"--kope-executor {name}: no such executor; choose one of {', '.join(EXECUTORS)}")
