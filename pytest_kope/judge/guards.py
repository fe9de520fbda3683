"""Oracle guards around every kernel call a test makes; user tests need no change.

- outputs are poisoned before the call and must be fully written after it;
- inputs must come back unchanged (unless declared `kope: inplace`);
- outputs must not change after the call returned (a thread still writing);
- the floating-point control state (x86 MXCSR: rounding, FTZ/DAZ) must be left as it was.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np

from ..errors import GuardViolation
from ..toolchains.base import IN, OUT, SCALAR, Kernel, KernelFunction
from . import fpstate

# NaNs with a payload no arithmetic produces (computed NaNs are canonical 0x7fc00000), so a legit NaN
# result is never mistaken for an unwritten element.
_POISON = {np.dtype("float32"): np.uint32(0x7FA5A5A5), np.dtype("float64"): np.uint64(0x7FF4A5A5A5A5A5A5)}
SETTLE_S = 0.002


def _host_view(value: Any) -> np.ndarray | None:
    """A numpy view (or copy, for device tensors) of an array argument."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch tensor
        t = value.detach()
        return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
    return None


def _poison(value: Any) -> None:
    if isinstance(value, np.ndarray):
        if value.dtype in _POISON:
            value.view(_POISON[value.dtype].dtype)[...] = _POISON[value.dtype]
        else:
            value.view(np.uint8)[...] = 0xA5
    elif hasattr(value, "fill_"):
        value.fill_(float("nan")) if value.is_floating_point() else value.fill_(-1)


def _unwritten(value: Any) -> int:
    host = _host_view(value)
    if host is None:
        return 0
    if isinstance(value, np.ndarray):
        if host.dtype not in _POISON:
            return 0
        return int(np.count_nonzero(host.view(_POISON[host.dtype].dtype) == _POISON[host.dtype]))
    return int(np.count_nonzero(np.isnan(host))) if host.dtype.kind == "f" else 0


def _digest(value: Any) -> int:
    host = _host_view(value)
    return zlib.crc32(np.ascontiguousarray(host).view(np.uint8)) if host is not None else 0


class GuardedFunction:
    """Callable like the kernel function, checking the oracle's rules on every call."""

    def __init__(self, function: KernelFunction):
        self.function = function
        self.name = function.name
        self.__name__ = function.name

    def __call__(self, *values: Any) -> Any:
        fn = self.function
        pairs = [(a, v) for a, v in zip(fn.args, values) if a.role != SCALAR]
        for arg, value in pairs:
            if arg.role == OUT:
                _poison(value)
        inputs = {arg.name: _digest(value) for arg, value in pairs if arg.role == IN}
        csr = fpstate.read()
        result = fn.raw(*values)
        after_csr = fpstate.read()
        problems = []
        if csr is not None and after_csr is not None and (csr ^ after_csr) & fpstate.CONTROL_MASK:
            fpstate.write(csr)
            problems.append(
                f"left the floating-point control state changed (MXCSR {csr:#06x} -> {after_csr:#06x})"
            )
        outputs = {}
        for arg, value in pairs:
            if arg.role != IN:
                missing = _unwritten(value)
                if missing:
                    size = _host_view(value).size
                    problems.append(f"left {missing} of {size} elements of output {arg.name!r} unwritten")
                outputs[arg.name] = _digest(value)
        for arg, value in pairs:
            if arg.role == IN and _digest(value) != inputs[arg.name]:
                problems.append(
                    f"modified input {arg.name!r} (declare `kope: inplace {arg.name}` if intended)"
                )
        time.sleep(SETTLE_S)
        for arg, value in pairs:
            if arg.role != IN and _digest(value) != outputs[arg.name]:
                problems.append(f"output {arg.name!r} changed after the call returned (work left running)")
        if problems:
            raise GuardViolation(f"kernel {fn.name}() " + "; ".join(problems))
        return result


class GuardedKernel:
    """What the `kernel` fixture gives a test: `kernel.softmax(x, y, rows, cols)`."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self._functions = {name: GuardedFunction(f) for name, f in kernel.functions.items()}

    def __getattr__(self, name: str) -> GuardedFunction:
        try:
            return self._functions[name]
        except KeyError:
            declared = ", ".join(self._functions) or "none"
            raise AttributeError(
                f"operator kernel {self.kernel.candidate.filename} has no kernel {name!r} (declared: {declared})"
            ) from None

    def __repr__(self) -> str:
        c = self.kernel.candidate
        return f"<kernel {c.filename} {c.short} {c.params}>"
