"""Accelerators without side effects: which ones are here, how to pin a child to one, how to time on one.

Nothing here initialises a device in the calling process. CUDA and the NPU runtime do not survive a
``fork``, and the judge forks its children from a warm parent, so every question that needs a device
context (is it usable, how many, what is it called) is asked in a short-lived child process, once per
process, after cheap checks (drivers, device nodes, tools on PATH) say it is worth asking.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Timer

# CANN's environment (its set_env.sh), which the Ascend toolchains' judging children need.
CANN_ENV = (
    "ASCEND_HOME_PATH",
    "ASCEND_TOOLKIT_HOME",  # the toolkit, its operator and AI CPU paths
    "ASCEND_OPP_PATH",
    "ASCEND_AICPU_PATH",
    "SOC_VERSION",  # the chip an Ascend C kernel is built for, from the CI job's env
    "KOPE_ASCEND_TARGET",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
)


def visible_devices_env(
    var: str | None, index: int, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment that pins a judging child to device `index` through the toolchain's `device_env_var`
    (empty for a CPU toolchain, whose `var` is None).

    `index` counts the devices this process sees: when the parent already has
    ``CUDA_VISIBLE_DEVICES=2,3``, index 1 gives ``CUDA_VISIBLE_DEVICES=3``.
    """
    if var is None:
        return {}
    if index < 0:
        raise ValueError(f"device index must be >= 0, got {index}")
    env = os.environ if environ is None else environ
    seen = [d.strip() for d in env.get(var, "").split(",") if d.strip()]
    if seen:
        if index >= len(seen):
            raise ValueError(f"device index {index} is out of range: {var}={env[var]} names {len(seen)}")
        return {var: seen[index]}
    return {var: str(index)}


def installed(dist: str) -> str | None:
    """Version of an installed distribution, or None; imports nothing."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def importable(module: str) -> bool:
    """Whether a module can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def triton_flavour() -> str | None:
    """Which `triton` package is installed: "ascend" (triton-ascend), "community", or None.

    Both distributions install a top-level ``triton/`` package; triton-ascend's has
    ``backends/ascend``. Decided from files, without importing triton or torch_npu.
    """
    spec = importlib.util.find_spec("triton") if importable("triton") else None
    if spec is None or not spec.origin:
        return None
    if (Path(spec.origin).parent / "backends" / "ascend").is_dir() or installed("triton-ascend"):
        return "ascend"
    return "community"


def probe(
    code: str, env: Mapping[str, str] | None = None, timeout: float = 120.0, argv: list[str] | None = None
) -> dict[str, Any]:
    """Run `code` in a fresh Python that prints one JSON object last; return it, or {"error": ...}."""
    full = {**os.environ, **(env or {})}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *(argv or [])],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"device probe timed out after {timeout:.0f}s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"device probe failed (exit {done.returncode}): {tail}"}
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": f"device probe printed {lines[-1]!r}"}
    return result if isinstance(result, dict) else {"error": f"device probe printed {result!r}"}


_CUDA_PROBE = """
import json, torch
ok = torch.cuda.is_available()
n = torch.cuda.device_count() if ok else 0
print(json.dumps({"ok": ok, "count": n, "names": [torch.cuda.get_device_name(i) for i in range(n)],
                  "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if n else "",
                  "cuda": torch.version.cuda or "", "hip": getattr(torch.version, "hip", None) or ""}))
"""

_NPU_PROBE = """
import json, torch, torch_npu
ok = torch.npu.is_available()
n = torch.npu.device_count() if ok else 0
print(json.dumps({"ok": ok, "count": n, "names": [torch.npu.get_device_name(i) for i in range(n)],
                  "cann": getattr(torch.version, "cann", "") or ""}))
"""


def nvidia_present() -> list[str]:
    """Cheap signs of an NVIDIA driver (nothing imported, nothing initialised); empty when none."""
    signs = []
    if Path("/proc/driver/nvidia/version").exists():
        signs.append("/proc/driver/nvidia")
    if Path("/dev/nvidia0").exists():
        signs.append("/dev/nvidia0")
    if shutil.which("nvidia-smi"):
        signs.append("nvidia-smi")
    return signs


@functools.lru_cache(maxsize=1)
def cuda_devices() -> dict[str, Any]:
    """{"ok", "count", "names", "capability", "cuda"} from a child process; {"ok": False, "why"} when none."""
    if not nvidia_present():
        return {"ok": False, "count": 0, "why": "no NVIDIA driver (no /dev/nvidia0, no nvidia-smi)"}
    if not importable("torch"):
        return {"ok": False, "count": 0, "why": "torch is not installed"}
    got = probe(_CUDA_PROBE)
    if "error" in got:
        return {"ok": False, "count": 0, "why": got["error"]}
    if not got.get("ok"):
        return {**got, "ok": False, "count": 0, "why": "torch.cuda.is_available() is False"}
    return got


def ascend_signs() -> tuple[list[str], list[str]]:
    """(found, missing): the cheap signs of a usable Ascend NPU, checked without importing anything."""
    checks = {
        "torch_npu": importable("torch_npu"),
        "ASCEND_HOME_PATH": bool(os.environ.get("ASCEND_HOME_PATH")),
        "npu-smi": shutil.which("npu-smi") is not None,
        "/dev/davinci*": any(Path("/dev").glob("davinci[0-9]*")),
    }
    return [k for k, v in checks.items() if v], [k for k, v in checks.items() if not v]


@functools.lru_cache(maxsize=1)
def npu_devices() -> dict[str, Any]:
    """Like `cuda_devices`, for Ascend NPUs through torch_npu; only probes when every sign is there."""
    found, missing = ascend_signs()
    if missing:
        return {"ok": False, "count": 0, "why": "no Ascend NPU here: missing " + ", ".join(missing)}
    got = probe(_NPU_PROBE, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    if "error" in got:
        return {"ok": False, "count": 0, "why": got["error"]}
    if not got.get("ok"):
        return {**got, "ok": False, "count": 0, "why": "torch.npu.is_available() is False"}
    return got


@dataclass(frozen=True)
class DeviceTimer(Timer):
    """A `Timer` on a device's own timeline.

    `clock()` records an event, waits for it and returns its time (seconds) since a reference event,
    so the difference of two readings is device time, like ``triton.testing.do_bench``.
    """

    device: str = ""


def event_timer(backend: Any, device: str) -> DeviceTimer:
    """A DeviceTimer for ``torch.cuda`` or ``torch.npu`` (`backend`); call in the process that times."""
    ref = backend.Event(enable_timing=True)
    ref.record()
    ref.synchronize()

    def clock() -> float:
        ev = backend.Event(enable_timing=True)
        ev.record()
        ev.synchronize()
        return float(ref.elapsed_time(ev)) / 1e3

    return DeviceTimer(clock=clock, sync=backend.synchronize, can_time=True, device=device)
