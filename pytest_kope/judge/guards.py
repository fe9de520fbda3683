"""Oracle guards around every kernel call a test makes; user tests need no change.

- outputs are poisoned before the call and must be fully written after it;
- inputs must come back unchanged (unless declared `kope: inplace`);
- outputs must not change after the call returned (a thread still writing);
- the floating-point control state (x86 MXCSR: rounding, FTZ/DAZ) must be left as it was;
- in a judging child (`PROBE`), a result must follow the data, not the buffer's address: a call with
  the same shapes as an earlier one is repeated with the earlier inputs copied into this call's
  buffers, and must give the earlier outputs (a cache keyed by pointer returns this call's instead).
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np

from ..errors import GuardViolation
from ..toolchains.base import IN, INOUT, OUT, SCALAR, Kernel, KernelFunction
from . import fpstate

# NaNs with a payload no arithmetic produces (computed NaNs are canonical 0x7fc00000), so a legit NaN
# result is never mistaken for an unwritten element.
_POISON = {np.dtype("float32"): np.uint32(0x7FA5A5A5), np.dtype("float64"): np.uint64(0x7FF4A5A5A5A5A5A5)}
SETTLE_S = 0.002
PROBE = False  # switched on in judging children only: plain runs pay nothing
PROBE_MAX_BYTES = 64 << 20  # remember calls up to this size for the address probe
_LAST: dict[tuple, tuple[dict[int, np.ndarray], dict[int, np.ndarray]]] = {}


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
        if not problems and PROBE:
            problems += _address_probe(fn, values)
        if problems:
            raise GuardViolation(f"kernel {fn.name}() " + "; ".join(problems))
        return result


def _address_probe(fn: KernelFunction, values: tuple) -> list[str]:
    """Repeat an earlier call's inputs in this call's buffers; a pointer-keyed cache gives itself away."""
    arrays = [(i, a) for i, a in enumerate(fn.args[: len(values)]) if a.role != SCALAR]
    if not arrays or any(a.role == INOUT or not isinstance(values[i], np.ndarray) for i, a in arrays):
        return []  # in-place or device arguments: not probed
    key = (fn.name, *((v.shape, v.dtype.str) if isinstance(v, np.ndarray) else repr(v) for v in values))
    now_in = {i: values[i].copy() for i, a in arrays if a.role == IN}
    now_out = {i: values[i].copy() for i, a in arrays if a.role == OUT}
    before = _LAST.get(key)
    if sum(v.nbytes for v in (*now_in.values(), *now_out.values())) <= PROBE_MAX_BYTES:
        _LAST[key] = (now_in, now_out)
    if before is None or not now_out:
        return []
    old_in, old_out = before
    if all(np.array_equal(old_in[i], now_in[i], equal_nan=True) for i in now_in):
        return []
    try:
        for i, v in old_in.items():
            values[i][...] = v
        fn.raw(*values)
        stale = [fn.args[i].name for i, v in old_out.items() if not _agrees(values[i], v)]
    finally:
        for i, v in (*now_in.items(), *now_out.items()):
            values[i][...] = v
    if not stale:
        return []
    names = ", ".join(repr(n) for n in stale)
    return [
        f"gave a stale result for output {names}: called again with an earlier call's inputs copied "
        "into this call's buffers, it did not reproduce that call's output (a result keyed on the "
        "buffer's address, not its content: a cache?)"
    ]


def _agrees(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype.kind not in "fc":
        return bool(np.array_equal(got, want))
    g, w = got.astype(np.float64), want.astype(np.float64)
    ok = np.isfinite(w)
    if not np.array_equal(np.isfinite(g), ok) or not np.array_equal(g[~ok], w[~ok], equal_nan=True):
        return False
    scale = float(np.abs(w[ok]).max()) if ok.any() else 0.0
    return bool((np.abs(g[ok] - w[ok]) <= 1e-3 * scale + 1e-30).all())


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
