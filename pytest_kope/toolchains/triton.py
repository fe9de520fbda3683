"""The `triton` toolchain: Triton kernels on NVIDIA GPUs, or through Triton's CPU interpreter.

Sources are Python modules with ``@triton.jit`` kernels and plain Python launchers; see
`pytest_kope.toolchains.pylaunch` for the ``# kope: kernel softmax(x: in, y: out, rows, cols)``
declaration and how ``# kope: param BLOCK = 128 | 256`` values reach the code (the build sets the
module's top-level ``BLOCK = ...`` literal).

Modes, decided once per process without touching a device in it:

* ``cuda``: a GPU answered in a child probe. Launches are real; the timer reads CUDA events
  (`devices.DeviceTimer`).
* ``interpreter``: no GPU, or ``TRITON_INTERPRET=1`` already set. The build sets
  ``TRITON_INTERPRET=1`` in this process before the source is imported (``triton.jit`` reads it
  when a kernel is decorated) and `environment()` hands it to judging children. Results are exact
  enough to judge correctness; times mean nothing, so `timer()` says it cannot time.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..errors import ToolchainMissing
from ..hardware import cpu_fingerprint
from ..spec import KernelSpec, Scalar
from . import devices, pylaunch
from .base import Arg, Availability, Kernel, KernelFunction, Timer, ToolchainBase

EXTRA_HINT = "pip install torch==2.13.0 'pytest-kope[triton]' (torch's CPU wheel; on a GPU machine, no pin)"
INTERPRETER_WHY = "Triton on CPU runs in the interpreter; its time means nothing"


class TritonToolchain(ToolchainBase):
    """Community Triton: real launches on CUDA, correctness-only through the interpreter elsewhere."""

    name = "triton"
    extensions: tuple[str, ...] = (".py",)
    extra = "triton"
    device_env_var: str | None = "CUDA_VISIBLE_DEVICES"
    jit_cache_env: str | None = (
        "TRITON_CACHE_DIR"  # a candidate's kernels compile once a run, not once per child
    )
    passes_env: tuple[str, ...] = ("TRITON_INTERPRET", "TORCH_DEVICE_BACKEND_AUTOLOAD")

    # -- where it runs ---------------------------------------------------------------------------
    def _missing(self) -> str | None:
        missing = [m for m in ("triton", "torch") if not devices.importable(m)]
        if missing == ["torch"]:
            return (
                "torch not installed: pip install torch==2.13.0 (torch's CPU wheel; on a GPU machine, no pin)"
            )
        if missing:
            return f"{' and '.join(missing)} not installed: {EXTRA_HINT}"
        return None

    def _devices(self) -> dict[str, Any]:
        if os.environ.get("TRITON_INTERPRET") == "1" and devices.nvidia_present():
            return {"ok": False, "count": 0, "why": "TRITON_INTERPRET=1 is set"}
        return devices.cuda_devices()

    def mode(self) -> str:
        """One of "cuda", "interpreter" or "missing"."""
        if self._missing():
            return "missing"
        return "cuda" if self._devices()["ok"] else "interpreter"

    def device(self) -> str:
        """The torch device a test should put its tensors on."""
        return "cuda" if self.mode() == "cuda" else "cpu"

    def availability(self) -> Availability:
        missing = self._missing()
        if missing:
            return Availability(False, missing)
        found = self._devices()
        if found["ok"]:
            names = ", ".join(found["names"])
            return Availability(
                True, f"cuda: {found['count']} GPU(s) ({names}), triton {devices.installed('triton')}"
            )
        return Availability(
            True, f"interpreter (TRITON_INTERPRET=1; correctness only, no timing): {found['why']}"
        )

    def bake(self, text: str, params: Mapping[str, Scalar]) -> str:
        """Python kernels carry the winning values also as module-level literals (pylaunch.bake)."""
        return pylaunch.bake(text, params)

    def count_devices(self) -> int:
        return int(self._devices().get("count", 0)) if self.mode() == "cuda" else 0

    def fingerprint(self) -> dict[str, Any]:
        found: dict[str, Any] = self._devices() if not self._missing() else {"ok": False}
        fp: dict[str, Any] = {
            **cpu_fingerprint(),
            "toolchain": self.name,
            "mode": self.mode(),
            "triton": devices.installed("triton") or devices.installed("triton-ascend"),
            "torch": devices.installed("torch"),
        }
        if found.get("ok"):
            fp.update(
                device=found["names"][0], capability=found.get("capability", ""), cuda=found.get("cuda", "")
            )
        else:
            fp["device"] = "cpu (triton interpreter)"
        return fp

    def environment(self) -> Mapping[str, str]:
        return {"TRITON_INTERPRET": "1"} if self.mode() == "interpreter" else {}

    def prepare_process(self) -> str:
        """Set this process's environment for the mode (e.g. ``TRITON_INTERPRET=1``); return the mode.

        Call it at the top of an operator repo's conftest.py: ``triton.jit`` reads TRITON_INTERPRET
        when a function is decorated, including triton's own library (``tl.sum``, ``tl.max``) at
        ``import triton``, so it must be set before any test module imports triton.
        """
        os.environ.update(self.environment())
        return self.mode()

    def screen(self, candidate: Candidate) -> list[str]:
        return pylaunch.screen(candidate.source, candidate.filename)

    def kernel_args(self, spec: KernelSpec, where: str) -> dict[str, tuple[Arg, ...]]:
        """The declared launchers' arguments (`pylaunch`'s declaration)."""
        return pylaunch.kernel_args(spec, where)

    # -- build and time --------------------------------------------------------------------------
    def _require(self) -> None:
        missing = self._missing()
        if missing:
            raise ToolchainMissing(f"toolchain {self.name!r}: {missing}")

    def build(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Kernel:
        self._require()
        where = candidate.filename
        args = pylaunch.kernel_args(spec, where)
        params = {**spec.space.defaults, **candidate.params}
        source = pylaunch.apply_params(candidate.source, params, where)
        # One folder per candidate: the interpreter re-reads kernel source lazily, so a file must never
        # be overwritten while a kernel loaded from it (the incumbent, in paired timing) is alive.
        build_dir = Path(build_dir) / f"{Path(candidate.filename).stem}-{candidate.hash}"
        build_dir.mkdir(parents=True, exist_ok=True)
        path = build_dir / Path(candidate.filename).name
        path.write_text(source)
        mode = self.mode()
        if mode != "cuda":
            _check_interpreter(self.name)
            os.environ["TRITON_INTERPRET"] = "1"  # read by triton.jit while the module is imported
        module = pylaunch.load_module(path, where)
        raw = pylaunch.launchers(module, args, where)
        if mode != "cuda" and devices.triton_flavour() == "ascend":
            raw = {name: _quiet(fn) for name, fn in raw.items()}
        # Not reentrant: Triton's interpreter is not thread-safe (measured: a concurrent replay that
        # passed once failed the next candidate's), and on a GPU the calls share one stream anyway.
        funcs = {name: KernelFunction(name, fn, args[name], reentrant=False) for name, fn in raw.items()}
        log = f"{self.name}: loaded {path} ({mode}) with " + (
            ", ".join(f"{k}={v!r}" for k, v in params.items()) or "no params"
        )
        return Kernel(
            candidate,
            funcs,
            build_log=log,
            extra={"device": self.device(), "mode": mode, "params": params, "module": module},
        )

    def timer(self) -> Timer:
        if self.mode() != "cuda":
            return Timer(can_time=False, why_not=INTERPRETER_WHY)
        import torch

        return devices.event_timer(torch.cuda, "cuda")


def _check_interpreter(toolchain: str) -> None:
    """Refuse to build when triton was imported before TRITON_INTERPRET=1: its own library would not run."""
    standard = sys.modules.get("triton.language.standard")
    if standard is None:
        return
    jitted = [type(v).__name__ for v in vars(standard).values() if type(v).__name__.endswith("Function")]
    if "JITFunction" in jitted and "InterpretedFunction" not in jitted:
        raise ToolchainMissing(
            f"toolchain {toolchain!r} needs Triton's interpreter here, but triton was imported before "
            "TRITON_INTERPRET=1 was set, so tl.sum/tl.max cannot run in it. Set it first: export "
            f"TRITON_INTERPRET=1, or put `{type_name(toolchain)}().prepare_process()` at the top of "
            "conftest.py (see conftest_templates/)"
        )


def type_name(toolchain: str) -> str:
    """The class name messages give for the toolchain called `toolchain`."""
    return {"triton": "TritonToolchain", "triton-ascend": "TritonAscendToolchain"}.get(toolchain, "Toolchain")


def _quiet(launcher: Any) -> Any:
    """`launcher` with triton-ascend 3.2's interpreter deprecation silenced (not the kernel's doing).

    Its interpreter turns 1-element arrays into loop bounds, which numpy 1.25+ deprecates; under
    ``filterwarnings = error`` every kernel with a runtime-bounded loop would fail. (numpy 2 refuses
    outright: use numpy<2 with triton-ascend 3.2.)
    """

    @functools.wraps(launcher)
    def call(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Conversion of an array with ndim > 0", DeprecationWarning)
            return launcher(*args, **kwargs)

    return call
