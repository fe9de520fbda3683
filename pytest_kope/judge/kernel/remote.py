"""The host's side of a kernel server: a `Kernel` whose functions forward each call.

A forwarded call copies the caller's arrays into the server's staging area (each at the same
distance past a 64-byte boundary as the caller's), runs the kernel there, and copies every array
back, so the guards around it see exactly what an in-process call would have left: outputs written
or still poisoned, inputs changed or not. Arrays already in the server's arena (a timing's copies,
`allocate`) travel as addresses, with no copy. After each call the server says whether the call
left its floating-point control state changed (in any thread): a `GuardViolation` here.

`Blocks` runs a timed block of calls in one request, on argument sets named once, and the host's
clock brackets it together with the server's continue and stop (`process.KernelProcess.running`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import GuardViolation, KernelError
from ...toolchains.base import Arg
from . import callmodes
from .process import KernelProcess


@dataclass
class Forwarded:
    """The callable a remote `KernelFunction.raw` is: `name` in `server`, checked as the in-process
    caller checks (`check(values)` raises TypeError for an argument the kernel cannot take)."""

    server: KernelProcess
    name: str
    args: tuple[Arg, ...]
    check: Callable[[tuple[Any, ...]], None] = lambda values: None
    fp_check: bool = True  # the server reports a changed floating-point control state after each call
    launched: Callable[[list[Any]], None] | None = None  # the toolchain's check of a call's launches
    __name__: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.__name__ = self.name

    def __call__(self, *values: Any) -> Any:
        self.check(values)
        with self.server.channel() as channel:
            described, staged = self._describe(values, channel)
            for view, value in staged:
                _copy(view, value)
            try:
                request = {"op": "call", "fn": self.name, "args": described, "check": self.fp_check}
                modes = callmodes.current()  # the caller's torch modes, made the call's in the server
                answer = self.server.ask({**request, "modes": modes} if modes else request, on=channel)
            except KernelError as e:  # a launch that does not lower says so before the kernel's error
                self.reported({"launches": e.launches})
                raise
            finally:
                for view, value in staged:  # even after a failure: what the call left is what it left
                    _copy(value, view)
        self.reported(answer)
        changed = answer.get("changed") or []
        if changed:
            raise GuardViolation(f"kernel {self.name}() " + "; ".join(str(c)[:300] for c in changed[:4]))
        return None

    def _describe(
        self, values: Sequence[Any], channel: int
    ) -> tuple[list[dict[str, Any]], list[tuple[Any, Any]]]:
        """Each value as the server reads it, and the (staged view, caller's array) pairs to copy."""
        arena = self.server.arena
        described: list[dict[str, Any]] = []
        pending: list[tuple[int, Any]] = []
        for i, value in enumerate(values):
            if not _is_array(value):
                described.append({"s": _scalar(value)})
                continue
            where = arena.locate(*_extent(value))
            if where is not None:
                described.append(_array(value, *where))
            else:
                described.append({})
                pending.append((i, value))
        staged: list[tuple[Any, Any]] = []
        if pending:
            segment, offsets = arena.stage(channel, [(_extent(v)[1], _extent(v)[0] % 64) for _, v in pending])
            for (i, value), offset in zip(pending, offsets):
                view = _view(segment.map, offset, value)
                described[i] = _array(value, segment.id, offset)
                staged.append((view, value))
        return described, staged

    def reported(self, answer: dict[str, Any]) -> None:
        """Hand the launches the server reported with `answer` to the toolchain's check (it may raise)."""
        if self.launched is not None and answer.get("launches"):
            self.launched(list(answer["launches"]))

    # -- timing ----------------------------------------------------------------------------------------
    def allocate(self, template: Any) -> Any:
        """A new array like `template` (dtype, shape, kind) in this server's arena: a timing's copy."""
        span = _extent(template)[1]
        segment, offset = self.server.arena.allocate(span)
        return _view(segment.map, offset, template)

    def blocks(self, sets: list[tuple[Any, ...]]) -> Blocks:
        return Blocks(self, sets)

    def state(self) -> list[str]:
        """What the server's process-wide state looks like against the load's (`procstate`)."""
        return [str(c)[:300] for c in self.server.ask({"op": "state"}).get("changed") or []]


@dataclass
class Blocks:
    """Timed blocks of `fn` over argument sets in its server's arena, named to the server once."""

    fn: Forwarded
    sets: list[tuple[Any, ...]]
    id: int = 0

    def __post_init__(self) -> None:
        self.id = self.fn.server.next_id()
        columns: list[dict[str, Any]] = []
        for values in self.sets:
            one, staged = self.fn._describe(values, 0)
            if staged:
                raise ValueError("a timed block's arguments must be in the kernel server's arena")
            if not columns:  # each argument once, with the places of its copies in lists
                columns = [dict(a, segs=[], offs=[]) if "seg" in a else a for a in one]
            for column, arg in zip(columns, one):
                if "seg" in arg:
                    column["segs"].append(arg["seg"])
                    column["offs"].append(arg["off"])
        self.fn.server.ask({"op": "sets", "id": self.id, "fn": self.fn.name, "columns": columns})

    def run(self, start: int, n: int, clock: Callable[[], float]) -> float:
        """Seconds from before the server is continued until after it is stopped again, for `n`
        calls from call number `start` (cycling the sets)."""
        server = self.fn.server
        with server.channel() as channel:
            message = {"op": "block", "sets": self.id, "start": start, "n": n}
            seconds, answer = server.timed(message, channel, clock)
        self.fn.reported(answer)
        return seconds


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or hasattr(value, "data_ptr")


def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    raise TypeError(f"a kernel argument of type {type(value).__name__} cannot be passed to a kernel server")


def _extent(value: Any) -> tuple[int, int]:
    """(address of the first byte, bytes spanned) of an array's data."""
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        return int(value.ctypes.data), int(value.nbytes)
    size = value.element_size()
    span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride())) if value.numel() else 0
    return int(value.data_ptr()), int(span * size)


def _array(value: Any, segment: int, offset: int) -> dict[str, Any]:
    if isinstance(value, np.ndarray):
        return {
            "seg": segment,
            "off": offset,
            "lib": "numpy",
            "dtype": value.dtype.str,
            "shape": list(value.shape),
        }
    span = _extent(value)[1] // value.element_size()
    return {
        "seg": segment,
        "off": offset,
        "lib": "torch",
        "dtype": str(value.dtype).removeprefix("torch."),
        "shape": list(value.shape),
        "strides": list(value.stride()),
        "span": span,
        "grad": bool(getattr(value, "requires_grad", False)),
    }


def _view(mapping: Any, offset: int, template: Any) -> Any:
    """An array like `template` over `mapping` at `offset` (C-contiguous numpy; torch with its strides)."""
    if isinstance(template, np.ndarray):
        count = math.prod(template.shape)
        return np.frombuffer(mapping, template.dtype, count, offset).reshape(template.shape)
    import torch

    span = max(1, _extent(template)[1] // template.element_size())
    flat = torch.frombuffer(mapping, dtype=template.dtype, count=span, offset=offset)
    return flat.as_strided(template.shape, template.stride())


def _copy(target: Any, source: Any) -> None:
    if isinstance(target, np.ndarray):
        np.copyto(target, source if isinstance(source, np.ndarray) else np.asarray(source), casting="no")
    else:
        with __import__("torch").no_grad():
            target.copy_(source)
