"""The `triton-ascend` toolchain: the same Python/Triton kernels on Huawei Ascend NPUs (device ``npu``).

Sources and declarations are those of the `triton` toolchain (see `pylaunch`). Modes:

* ``npu``: torch_npu is importable, ``ASCEND_HOME_PATH`` is set, ``npu-smi`` is on PATH,
  ``/dev/davinci*`` exist, and ``torch.npu.is_available()`` said yes in a child process. Launches are
  real (triton-ascend compiles through CANN's bishengir); the timer reads ``torch.npu.Event``.
* ``interpreter+gate``: no NPU, but the installed ``triton`` is triton-ascend's. Correctness runs
  through Triton's CPU interpreter, and every kernel launch is first compiled for an Ascend target
  (``KOPE_ASCEND_TARGET``, default Ascend910B2) as far as it goes without CANN: TTIR, then Linalg
  (``.ttadapter``). A kernel that does not get that far raises `BuildError` quoting triton-ascend's
  message; the check runs at a kernel's first launch with each new signature, because only the
  launch gives argument dtypes and constexpr values (a real NPU also compiles there).
* ``interpreter``: community triton is installed (triton-ascend ships its own ``triton/`` package and
  cannot live beside it), so only correctness is checked; install triton-ascend in its own
  environment for the lowering check.

Nothing here imports torch_npu in the calling process until an NPU has been confirmed: installing
torch_npu without CANN breaks ``import torch`` unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``, which the
non-NPU modes set for themselves and for judging children.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..hardware import cpu_fingerprint
from . import devices
from .base import Availability, Timer
from .triton import INTERPRETER_WHY, TritonToolchain

DEFAULT_TARGET = "Ascend910B2"
_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "grid", "warmup", "enable_fp_fusion", "debug"}
_DTYPES = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "bool": "i1",
}


def gate_target() -> str:
    """The Ascend target the lowering check compiles for (KOPE_ASCEND_TARGET)."""
    return os.environ.get("KOPE_ASCEND_TARGET", DEFAULT_TARGET)


class TritonAscendToolchain(TritonToolchain):
    """triton-ascend + torch_npu; on a machine without an NPU, the interpreter plus a lowering check."""

    name = "triton-ascend"
    extra = "ascend"
    device_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    passes_env: tuple[str, ...] = ("TRITON_INTERPRET", *devices.CANN_ENV)

    def _missing(self) -> str | None:
        missing = [m for m in ("triton", "torch") if not devices.importable(m)]
        if missing:
            return (
                f"{' and '.join(missing)} not installed: pip install 'pytest-kope[ascend]' "
                "(in an environment without community triton; CPU-only: pip install torch==2.13.0 first)"
            )
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
                f"; numpy {numpy} breaks loops with runtime bounds in triton-ascend's interpreter, "
                "install numpy<2"
                if int(numpy.split(".")[0]) >= 2
                else ""
            )
            return Availability(
                True,
                f"interpreter + Ascend lowering check (triton-ascend "
                f"{devices.installed('triton-ascend')}, target {gate_target()}, "
                f"TTIR->Linalg); correctness only, no timing: {found['why']}{caveat}",
            )
        return Availability(
            True,
            "interpreter only, no Ascend lowering check (community triton is installed; "
            f"use triton-ascend in its own environment); no timing: {found['why']}",
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

    def build(self, candidate, spec, build_dir):  # type: ignore[no-untyped-def]
        mode = self.mode()
        if mode == "npu":
            import torch_npu  # noqa: F401  (registers the npu device and triton-ascend's driver)
        elif mode != "missing":
            os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        return super().build(candidate, spec, build_dir)

    def _wrap(self, fns: dict[str, Any], module: Any, build_dir: Path) -> dict[str, Any]:
        if self.mode() != "interpreter+gate":
            return fns
        path = Path(module.__file__)
        gate = AscendGate(path, build_dir / "ascend-gate")
        for name, value in list(vars(module).items()):
            if (
                type(value).__name__ == "InterpretedFunction"
                and getattr(value.fn, "__module__", "") == module.__name__
            ):
                setattr(module, name, GatedKernel(name, value, gate))
        return fns

    def timer(self) -> Timer:
        if self.mode() != "npu":
            return Timer(can_time=False, why_not=INTERPRETER_WHY)
        import torch
        import torch_npu  # noqa: F401

        return devices.event_timer(getattr(torch, "npu"), "npu")  # noqa: B009 - torch_npu adds it, torch's types do not know

    def count_devices(self) -> int:
        return int(self._devices().get("count", 0)) if self.mode() == "npu" else 0


_GATE = """
import contextlib, glob, importlib.util, io, json, sys
path, name, signature, constants, target, cache = sys.argv[1:]
spec = importlib.util.spec_from_file_location("kope_ascend_gate", path)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
chatter = io.StringIO()
try:
    with contextlib.redirect_stdout(chatter):
        src = ASTSource(fn=getattr(module, name), signature=json.loads(signature), constants=json.loads(constants))
        triton.compile(src, target=GPUTarget("npu", target, 0))
    print(json.dumps({"stage": "npubin"}))
except Exception as e:
    if glob.glob(cache + "/**/*.ttadapter", recursive=True):
        print(json.dumps({"stage": "linalg"}))  # lowered; the rest needs CANN (bishengir), not here
    else:
        print(json.dumps({"fail": f"{type(e).__name__}: {e}".strip()}))
"""

# a kernel, its Triton signature (argument -> type) and constexpr values: one lowering check
_GateKey = tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, Any], ...]]


class AscendGate:
    """Compiles a kernel for an Ascend target, as far as this machine allows, once per signature.

    It runs in a child process: triton reads TRITON_INTERPRET when a function is decorated, its own
    library included, so a process that interprets cannot also compile.
    """

    def __init__(self, path: Path, cache_dir: Path, target: str | None = None):
        self.path, self.cache_dir, self.target = Path(path), Path(cache_dir), target or gate_target()
        self.passed: dict[_GateKey, str] = {}  # launches checked -> the stage reached

    def check(self, name: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        signature, constants = self.describe(fn, args, kwargs)
        key = (name, tuple(signature.items()), tuple(sorted(constants.items(), key=str)))
        if key not in self.passed:
            self.passed[key] = self.lower(name, signature, constants)

    @staticmethod
    def describe(
        fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, str], dict[str, Any]]:
        """Triton's signature (name -> type) and constexpr values of one launch of Python function `fn`."""
        import inspect

        kwargs = {k: v for k, v in kwargs.items() if k not in _LAUNCH_OPTIONS}
        sig = inspect.signature(fn)
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        signature, constants = {}, {}
        for name, value in bound.arguments.items():
            if "constexpr" in str(sig.parameters[name].annotation):
                constants[name] = value
            else:
                signature[name] = _triton_type(value)
        return signature, constants

    def lower(self, name: str, signature: dict[str, str], constants: dict[str, Any]) -> str:
        """Compile in a child; return the stage reached, or raise BuildError quoting triton-ascend."""
        out = self.cache_dir / f"{name}-{len(self.passed)}"
        out.mkdir(parents=True, exist_ok=True)
        env = {"TRITON_INTERPRET": "0", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TRITON_CACHE_DIR": str(out)}
        argv = [str(self.path), name, json.dumps(signature), json.dumps(constants), self.target, str(out)]
        got = devices.probe(_GATE, env=env, argv=argv, timeout=600)
        if "stage" in got:
            return str(got["stage"])
        shutil.rmtree(out, ignore_errors=True)
        raise BuildError(
            self.path.name,
            f"kernel {name} does not lower for Ascend "
            f"({self.target}, triton-ascend {devices.installed('triton-ascend')}):\n"
            f"{got.get('fail') or got.get('error')}",
        )


def _triton_type(value: Any) -> str:
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        name = str(value.dtype).rsplit(".", 1)[-1]
        if name not in _DTYPES:
            raise TypeError(f"no Triton pointer type for tensor dtype {value.dtype}")
        return "*" + _DTYPES[name]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"cannot pass {type(value).__name__} to a Triton kernel")


class GatedKernel:
    """Stands in for an interpreted kernel: each launch is gated by `AscendGate`, then interpreted."""

    def __init__(self, name: str, interpreted: Any, gate: AscendGate):
        self._name, self._interpreted, self._gate = name, interpreted, gate

    def __getitem__(self, grid: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            self._gate.check(self._name, self._interpreted.fn, args, kwargs)
            return self._interpreted[grid](*args, **kwargs)

        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # a @triton.jit helper called from a kernel
        return self._interpreted(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._interpreted, name)
