"""The `triton-ascend` toolchain: the same Python/Triton kernels on Huawei Ascend NPUs (device ``npu``).

Sources and declarations are those of the `triton` toolchain (see `pylaunch`). Modes:

* ``npu``: torch_npu is importable, ``ASCEND_HOME_PATH`` is set, ``npu-smi`` is on PATH,
  ``/dev/davinci*`` exist, and ``torch.npu.is_available()`` said yes in a child process. Launches are
  real (triton-ascend compiles through CANN's bishengir); the timer reads ``torch.npu.Event``.
* ``interpreter+gate``: no NPU, but the installed ``triton`` is triton-ascend's. Correctness runs
  through Triton's CPU interpreter, and every kernel launch, whatever wraps the kernel, is first
  compiled for an Ascend target (``KOPE_ASCEND_TARGET``, default Ascend910B2) as far as it goes
  without CANN: TTIR, then Linalg (``ascend_lowering``). A launch that does not get that far fails
  with `LoweringFailed`, one line quoting triton-ascend; the check runs at each new launch signature,
  because only the launch gives argument dtypes and constexpr values (a real NPU compiles there too).
* ``interpreter``: community triton is installed (triton-ascend ships its own ``triton/`` package and
  cannot live beside it), so only correctness is checked; install triton-ascend in its own
  environment for the lowering check.

Nothing here imports torch_npu in the calling process until an NPU has been confirmed: installing
torch_npu without CANN breaks ``import torch`` unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, which the
non-NPU modes set for themselves and for judging children.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..hardware import cpu_fingerprint
from ..spec import KernelSpec
from . import ascend_lowering, devices, launches, pylaunch
from .base import Availability, Kernel, Served, Timer
from .triton import INTERPRETER_WHY, TritonToolchain

DEFAULT_TARGET = "Ascend910B2"
TORCH_PIN = "torch==2.13.0"  # torch's CPU wheel where the index has it; never an unpinned torch (CUDA)
VENV_HINT = f"python -m venv .venv-ascend && .venv-ascend/bin/pip install {TORCH_PIN} 'pytest-kope[ascend]'"


def gate_target() -> str:
    """The Ascend target the lowering check compiles for (KOPE_ASCEND_TARGET)."""
    return os.environ.get("KOPE_ASCEND_TARGET", DEFAULT_TARGET)


class TritonAscendToolchain(TritonToolchain):
    """triton-ascend + torch_npu; on a machine without an NPU, the interpreter plus a lowering check."""

    name = "triton-ascend"
    extra = "ascend"
    device_env_var: str | None = "ASCEND_RT_VISIBLE_DEVICES"
    passes_env: tuple[str, ...] = ("TRITON_INTERPRET", *devices.CANN_ENV)

    def _missing(self) -> str | None:
        """What is not installed, and the one command that installs it (torch's CPU wheel, pinned: an
        unpinned torch is the CUDA build, several GB)."""
        torch, triton = devices.importable("torch"), devices.importable("triton")
        if not torch and not triton:
            return f"triton-ascend and torch not installed: pip install {TORCH_PIN} 'pytest-kope[ascend]'"
        if not torch:
            return f"torch not installed: pip install {TORCH_PIN} (on an NPU machine: the torch your torch_npu names)"
        if not triton:
            return "triton-ascend not installed: pip install 'pytest-kope[ascend]' (in an environment without community triton)"
        return None

    def _devices(self) -> dict[str, Any]:
        return devices.npu_devices()

    def mode(self) -> str:
        """One of "npu", "interpreter+gate", "interpreter" or "missing"."""
        if self._missing():
            return "missing"
        if self._devices()["ok"]:
            return "npu"
        return "interpreter+gate" if devices.triton_flavour() == "ascend" else "interpreter"

    def device(self) -> str:
        return "npu" if self.mode() == "npu" else "cpu"

    def availability(self) -> Availability:
        missing = self._missing()
        if missing:
            return Availability(False, missing)
        found, mode = self._devices(), self.mode()
        if mode == "npu":
            names = ", ".join(found["names"])
            return Availability(
                True,
                f"npu: {found['count']} NPU(s) ({names}), triton-ascend {devices.installed('triton-ascend')}",
            )
        if mode == "interpreter+gate":
            numpy = devices.installed("numpy") or "0"
            caveat = (
                f"; numpy {numpy} breaks loops with runtime bounds in triton-ascend's interpreter: "
                "pip install 'numpy<2'"
                if int(numpy.split(".")[0]) >= 2
                else ""
            )
            return Availability(
                True,
                f"interpreter + Ascend lowering check (triton-ascend "
                f"{devices.installed('triton-ascend')}, target {gate_target()}, every launch through "
                f"TTIR to Linalg; the NPU binary needs CANN); correctness only, no timing: "
                f"{found['why']}{caveat}",
            )
        return Availability(
            True,
            "interpreter only, no Ascend lowering check: the installed triton is community triton; for "
            f"the check, a separate environment: {VENV_HINT}; no timing: {found['why']}",
        )

    def fingerprint(self) -> dict[str, Any]:
        found: dict[str, Any] = self._devices() if not self._missing() else {"ok": False}
        fp: dict[str, Any] = {
            **cpu_fingerprint(),
            "toolchain": self.name,
            "mode": self.mode(),
            "triton": devices.installed("triton-ascend") or devices.installed("triton"),
            "torch": devices.installed("torch"),
            "torch_npu": devices.installed("torch_npu") or devices.installed("torch-npu"),
        }
        if found.get("ok"):
            fp.update(device=found["names"][0], cann=found.get("cann", ""))
        else:
            fp.update(device="cpu (triton interpreter)", target=gate_target())
        return fp

    def environment(self) -> Mapping[str, str]:
        if self.mode() == "npu":
            return {}
        return {"TRITON_INTERPRET": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}

    def build(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Kernel:
        mode = self.mode()
        if mode == "npu":
            import torch_npu  # noqa: F401  (registers the npu device and triton-ascend's driver)
        elif mode != "missing":
            os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        kernel = super().build(candidate, spec, build_dir)
        if mode == "interpreter+gate":  # every launch lowered for Ascend (`ascend_lowering`)
            launches.install()
            module = kernel.extra["module"]
            reporting = os.environ.get(ascend_lowering.REPORT_ENV) == "1"
            gate = (
                ascend_lowering.Reporting(module)
                if reporting
                else ascend_lowering.Checking(module, gate_target())
            )
            for function in kernel.functions.values():
                function.raw = gate.watched(function.raw)
            if isinstance(gate, ascend_lowering.Reporting):
                kernel.extra["launches"] = gate.take
        return kernel

    def served(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Served:
        """The server builds and serves the kernel as for `triton`; in the lowering-check mode it
        reports each new launch with the call's answer, and the host lowers it (`ascend_lowering`):
        the server's filter allows no process, and the compile needs two."""
        served = super().served(candidate, spec, build_dir)
        if self.mode() != "interpreter+gate":
            return served
        params = {**spec.space.defaults, **candidate.params}
        text = pylaunch.apply_params(candidate.source, params, candidate.filename)
        lowering = ascend_lowering.Lowering(text, Path(candidate.filename).name, gate_target())
        environment = {**served.load["environment"], ascend_lowering.REPORT_ENV: "1"}
        load = {**served.load, "environment": environment}
        return replace(served, load=load, launched=ascend_lowering.HostCheck(lowering))

    def timer(self) -> Timer:
        if self.mode() != "npu":
            return Timer(can_time=False, why_not=INTERPRETER_WHY)
        import torch
        import torch_npu  # noqa: F401

        return devices.event_timer(getattr(torch, "npu"), "npu")  # noqa: B009 - torch_npu adds it, torch's types do not know

    def count_devices(self) -> int:
        return int(self._devices().get("count", 0)) if self.mode() == "npu" else 0
