"""A performance test's inputs, made once per fork server instead of once per timing child.

A perf test's body makes its inputs (tens of millions of random numbers: 0.2-1 s on a 2-vCPU VM,
more than the timed calls of a fast candidate) and hands them to `kope_bench(kernel.f, *args)`.
The body is the repo's own code and does the same for every candidate, so the fork server runs it
once per seed, before forking, with a stand-in kernel no code of which can run and a `kope_bench`
that only writes down its arguments. A timing child forked afterwards then skips the body and
times the candidate on those arrays (inherited copy-on-write: the server never sees what a child
writes into them, and the next child gets them as made).

Only a body that does nothing with the kernel but pass its functions to `kope_bench`, and passes
in the server, is recorded; any other (one that calls the kernel itself, checks outputs after
timing, or fails) runs in each child as before. Fresh processes (the winner's verification) always
run the body.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pytest

from . import state
from .state import Recorded


class NotRecordable(Exception):
    """The body used the kernel for more than `kope_bench(kernel.f, ...)`: it runs in each child."""


@dataclass(frozen=True)
class StandInFunction:
    """`kernel.f` while recording: a name that `kope_bench` accepts and that cannot be called."""

    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotRecordable(f"the test calls kernel.{self.name} itself")


class StandInKernel:
    """The `kernel` fixture while recording: function names, no code (a name the real kernel lacks
    fails in the child, as the body would have)."""

    def __getattr__(self, name: str) -> StandInFunction:
        if name.startswith("_"):
            raise NotRecordable(f"the test uses kernel.{name}")
        return StandInFunction(name)


class RecordingBench:
    """The `kope_bench` fixture while recording: writes down what would be timed."""

    def __init__(self, calls: Recorded):
        self.calls = calls

    def __call__(self, function: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(function, StandInFunction) or kwargs:
            raise NotRecordable("kope_bench was given something other than kernel.f and positional arguments")
        self.calls.append((function.name, args))


def record(item: pytest.Item, seed: int) -> Recorded | None:
    """Run `item` here (setup, body, teardown) with the stand-ins and `seed` bound as its `kope_seed`
    (the session's SEED otherwise); its calls, or None when the body is not recordable. The item's
    own parameters are restored afterwards."""
    from _pytest.runner import runtestprotocol

    run = state.of(item.config)
    key = (item.nodeid, seed)
    if key in run.kept:
        return run.kept[key]
    callspec = getattr(item, "callspec", None)
    saved = dict(callspec.params) if callspec is not None else {}
    if callspec is not None and "kope_seed" in callspec.params:
        callspec.params["kope_seed"] = seed
    calls: Recorded = []
    run.recording = calls
    try:
        reports = runtestprotocol(item, log=False, nextitem=None)
        ok = all(r.passed for r in reports) and bool(calls)
    except Exception:  # noqa: BLE001 - whatever the body did, it simply runs in each child instead
        ok = False
        with contextlib.suppress(Exception):  # nothing of it stays set up for the children
            item.session._setupstate.teardown_exact(None)
    finally:
        run.recording = None
        if callspec is not None:
            callspec.params.clear()
            callspec.params.update(saved)
    run.kept[key] = calls if ok else None  # None: not recordable
    return run.kept[key]


def replay(item: pytest.Item, seed: int) -> bool:
    """In a forked timing child: time the recorded calls through the item's real `kope_bench` and
    `kernel` instead of running its body. False when there is nothing recorded (the body runs)."""
    calls = state.of(item.config).kept.get((item.nodeid, seed))
    if not calls:
        return False
    values = item.funcargs  # type: ignore[attr-defined]  # every fixture of the item, set up
    bench, kernel = values["kope_bench"], values["kernel"]
    bench.outputs_unread = True  # no body runs after the calls to read what they wrote
    for name, args in calls:
        bench(getattr(kernel, name), *args)
    return True
