"""Oracle guards around every kernel call a test makes; user tests need no change.

Each guard is one small class in `GUARDS`: `before(call)` runs just before the kernel, `after(call)`
returns what it found wrong. Adding a guard is one class and one line in the list.

- outputs are poisoned before the call and must be fully written after it;
- inputs must come back unchanged (unless declared `kope: inplace`);
- the floating-point control state (x86 MXCSR: rounding, FTZ/DAZ; x87 control word) must be left as
  it was, in the caller's thread and in every other thread (an OpenMP pool);
- outputs must not change after the call returned (a thread still writing);
- in a judging child (`Switches.probe`), a result must follow the data, not the buffer's address: a call with
  the same shapes as an earlier one is repeated with the earlier inputs copied into this call's
  buffers, and must give the earlier outputs (a cache keyed by pointer returns this call's instead).

A judging child may also set `Switches.recorder`, which sees each call's inputs and outputs (the
differential check records the committed kernel's calls this way). The switches are the run's
(`state.ChildState`), set once by the child from its request (`JudgeRequest.guard_switches`); plain
runs leave them off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...errors import GuardViolation
from ...toolchains.base import IN, INOUT, OUT, SCALAR, Kernel, KernelFunction
from .. import arrays
from . import fpstate
from .state import ChildState

SETTLE_S = 0.002
PROBE_MAX_BYTES = 64 << 20  # remember calls up to this size for the address probe


@dataclass
class Call:
    """One kernel call as the guards see it."""

    function: KernelFunction
    values: tuple[Any, ...]
    run: ChildState = field(default_factory=ChildState)  # the process's switches and remembered calls
    state: dict[str, Any] = field(default_factory=dict)  # what the guards' `before` noted

    @property
    def arrays(self) -> list[tuple[int, Any, Any]]:
        """(index, Arg, value) of every array argument."""
        return [
            (i, a, v) for i, (a, v) in enumerate(zip(self.function.args, self.values)) if a.role != SCALAR
        ]


class PoisonOutputs:
    """Outputs are poisoned before the call and must be fully written after it."""

    needs_clean = False

    def before(self, call: Call) -> None:
        for _, arg, value in call.arrays:
            if arg.role == OUT:
                arrays.poison(value)

    def after(self, call: Call) -> list[str]:
        out = []
        for _, arg, value in call.arrays:
            if arg.role != IN and (missing := arrays.unwritten(value)):
                out.append(
                    f"left {missing} of {getattr(arrays.host(value), 'size', 0)} elements of output {arg.name!r} unwritten"
                )
        return out


class InputsUnchanged:
    """Inputs must come back unchanged, unless declared `kope: inplace`."""

    needs_clean = False

    def before(self, call: Call) -> None:
        call.state["inputs"] = {a.name: arrays.digest(v) for _, a, v in call.arrays if a.role == IN}

    def after(self, call: Call) -> list[str]:
        return [
            f"modified input {a.name!r} (declare `kope: inplace {a.name}` if intended)"
            for _, a, v in call.arrays
            if a.role == IN and arrays.digest(v) != call.state["inputs"][a.name]
        ]


class FloatingPointState:
    """The floating-point control state (MXCSR, x87 control word) must be left as it was, in the
    caller's thread and in every thread the kernel may have run on (its OpenMP pool)."""

    needs_clean = False

    def before(self, call: Call) -> None:
        call.state["fp"] = fpstate.current()

    def after(self, call: Call) -> list[str]:
        return fpstate.changes(call.state["fp"])


class OutputsSettled:
    """Outputs must not change after the call returned (a thread still writing)."""

    needs_clean = False

    def before(self, call: Call) -> None:
        pass

    def after(self, call: Call) -> list[str]:
        if call.run.switches.settled_in_replay:
            return []
        later = SettleLater()
        later.add(call)
        return later.check()


class SettleLater:
    """`OutputsSettled` for many calls with one wait: each call's outputs are digested when it returns
    and checked again once `SETTLE_S` has passed since the last one (the differential replay makes
    about a hundred calls on buffers only it holds; a wait per call was a fifth of a judgement)."""

    def __init__(self) -> None:
        self.pending: list[tuple[Call, dict[int, int]]] = []
        self.returned = 0.0

    def add(self, call: Call) -> None:
        """Digest the outputs of a call that just returned."""
        self.pending.append((call, {i: arrays.digest(v) for i, a, v in call.arrays if a.role != IN}))
        self.returned = time.monotonic()

    def check(self, named: bool = False) -> list[str]:
        """What changed since it was digested (`named`: each line names its kernel); the calls are
        forgotten."""
        time.sleep(max(0.0, SETTLE_S - (time.monotonic() - self.returned)))
        found = [
            (f"kernel {call.function.name}() " if named else "")
            + f"output {a.name!r} changed after the call returned (work left running)"
            for call, written in self.pending
            for i, a, v in call.arrays
            if i in written and arrays.digest(v) != written[i]
        ]
        self.pending = []
        return found


class AddressProbe:
    """Repeat an earlier call's inputs in this call's buffers; a pointer-keyed cache gives itself away."""

    needs_clean = True  # re-runs the kernel: only worth it when the call itself was clean

    def before(self, call: Call) -> None:
        pass

    def after(self, call: Call) -> list[str]:
        if not call.run.switches.probe:
            return []
        fn, values = call.function, call.values
        found = call.arrays
        if not found or any(a.role == INOUT or not isinstance(v, np.ndarray) for _, a, v in found):
            return []  # in-place or device arguments: not probed
        if sum(v.nbytes for _, _, v in found) > PROBE_MAX_BYTES:
            return []  # never remembered, so never probed: copying it was a perf test's slowest guard
        key = (fn.name, *((v.shape, v.dtype.str) if isinstance(v, np.ndarray) else repr(v) for v in values))
        now_in = {i: v.copy() for i, a, v in found if a.role == IN}
        now_out = {i: v.copy() for i, a, v in found if a.role == OUT}
        before = call.run.last_calls.get(key)
        call.run.last_calls[key] = (now_in, now_out)
        if before is None or not now_out:
            return []
        old_in, old_out = before
        if all(np.array_equal(old_in[i], now_in[i], equal_nan=True) for i in now_in):
            return []
        try:
            for i, v in old_in.items():
                values[i][...] = v
            fn.raw(*values)
            stale = [fn.args[i].name for i, v in old_out.items() if arrays.mismatch(values[i], v)]
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


class Guard(Protocol):
    """One rule of the oracle: `before` prepares a call, `after` says what the call did wrong."""

    needs_clean: bool  # skip `after` once an earlier guard found a problem with this call

    def before(self, call: Call) -> None: ...

    def after(self, call: Call) -> list[str]: ...


# Order matters for the reports (the first violation found is the one named first), and the FP state
# is looked at last: after every call the guards made, the address probe's repeated one included.
GUARDS: list[Guard] = [
    PoisonOutputs(),
    InputsUnchanged(),
    OutputsSettled(),
    AddressProbe(),
    FloatingPointState(),
]


def replay_guards() -> list[Guard]:
    """The guards for the differential replay, whose outputs the controller compares itself: a cache
    keyed by address gives wrong outputs there, so no address probe (it doubled the replay's calls);
    settling is checked for all calls at once (`SettleLater`)."""
    return [g for g in GUARDS if not isinstance(g, (OutputsSettled, AddressProbe))]


class GuardedFunction:
    """Callable like the kernel function, checking the oracle's rules (`guards`) on every call."""

    def __init__(
        self, function: KernelFunction, guards: list[Guard] | None = None, run: ChildState | None = None
    ):
        self.function = function
        self.name = function.name
        self.__name__ = function.name
        self.guards = guards  # None: whatever `GUARDS` holds at each call
        self.run = run if run is not None else ChildState()  # a plain state: every switch off

    @property
    def active_guards(self) -> list[Guard]:
        """The guards a call runs now: its own, or whatever `GUARDS` holds."""
        return GUARDS if self.guards is None else self.guards

    def __call__(self, *values: Any) -> Any:
        began = time.perf_counter()
        try:
            return self._checked(values)
        finally:
            self.run.called_s += time.perf_counter() - began

    def _checked(self, values: tuple[Any, ...]) -> Any:
        call = Call(self.function, values, self.run)
        recorder = self.run.switches.recorder
        inputs = {i: arrays.host_copy(v) for i, a, v in call.arrays if a.role != OUT} if recorder else {}
        active = self.active_guards
        for guard in active:
            guard.before(call)
        result = self.function.raw(*values)
        problems: list[str] = []
        for guard in active:
            if not (problems and guard.needs_clean):
                problems += guard.after(call)
        if problems:
            raise GuardViolation(f"kernel {self.name}() " + "; ".join(problems))
        if recorder is not None:
            recorder(self.function, values, inputs)
        return result


class GuardedKernel:
    """What the `kernel` fixture gives a test: `kernel.softmax(x, y, rows, cols)`."""

    def __init__(self, kernel: Kernel, guards: list[Guard] | None = None, run: ChildState | None = None):
        self.kernel = kernel
        self._functions = {name: GuardedFunction(f, guards, run) for name, f in kernel.functions.items()}

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


def functions_of(kernel: GuardedKernel) -> dict[str, GuardedFunction]:
    """A guarded kernel's functions by name (not an attribute: a kernel function may have any name)."""
    return kernel._functions
