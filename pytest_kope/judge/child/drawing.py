"""Running Hypothesis for `draws.py`: drawing the calls a committed kernel keeps (in its recording
child), writing them where candidates replay them, and shrinking a drawn call a candidate got wrong
(in a child holding the candidate and the committed kernel). Hypothesis draws and shrinks here; it
never judges: the controller compares outputs.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...toolchains.base import KernelFunction
from .. import arrays
from . import callfiles, large, noise, torchmodes
from .draws import (
    DRAW_S,
    GRAD_MODES,
    KEPT_KERNEL_S,
    MAX_EXAMPLES,
    MAX_KEPT,
    SHRINK_S,
    TEST,
    Drawn,
    Plan,
    call_arguments,
    plan,
    strategy,
    with_inputs,
    written_outputs,
)


def _settings(**more: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    from hypothesis import HealthCheck, Verbosity, settings

    chosen: Callable[[Callable[..., None]], Callable[..., None]] = settings(
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
        verbosity=Verbosity.quiet,
        **more,
    )
    return chosen


class _Enough(Exception):
    """The drawing's budget is spent: Hypothesis stops here."""


def draw(p: Plan, fn: KernelFunction) -> list[tuple[Drawn, dict[int, np.ndarray]]]:
    """Calls of `fn` (the committed kernel) drawn by Hypothesis, each with its outputs."""
    from hypothesis import Phase, assume, given, seed

    kept: list[tuple[Drawn, dict[int, np.ndarray]]] = []
    began, spent = time.monotonic(), [0.0]

    @seed(secrets.randbits(64))
    @_settings(database=None, phases=[Phase.generate], max_examples=MAX_EXAMPLES)
    @given(strategy(p))
    def search(drawn: Drawn) -> None:
        if len(kept) >= MAX_KEPT or spent[0] > KEPT_KERNEL_S or time.monotonic() - began > DRAW_S:
            raise _Enough
        values = call_arguments(p, fn, drawn)
        called = time.perf_counter()
        fn.raw(*values)
        took = time.perf_counter() - called  # what a candidate's replay of the call costs, about
        outputs = written_outputs(fn, values)
        assume(outputs is not None)  # the oracle itself breaks here: nothing to hold a candidate to
        assert outputs is not None
        spent[0] += took
        kept.append((drawn, outputs))

    try:
        search()
    except _Enough:
        pass
    except Exception as e:  # Unsatisfiable: no drawn call kept the committed kernel finite
        if not kept:
            raise NoDraws(f"no drawn call kept the committed kernel finite ({type(e).__name__})") from None
    return _measured(p, fn, kept)


def _measured(
    p: Plan, fn: KernelFunction, kept: list[tuple[Drawn, dict[int, np.ndarray]]]
) -> list[tuple[Drawn, dict[int, np.ndarray]]]:
    """The kept calls with the committed kernel's own error on each (`noise.py`), measured after the
    drawing (its time is not the drawing's); a call whose outputs are not robust to its inputs'
    rounding is dropped: there is no answer to hold a candidate to."""
    robust = []
    for drawn, outputs in kept:
        own = noise.own_error(with_inputs(p, fn, drawn), drawn.inputs, outputs)
        if own is not None:
            drawn.own_error = own
            robust.append((drawn, outputs))
    return robust


class NoDraws(Exception):
    """Nothing could be drawn for a function."""


def write(calls: list[Any], folder: Path) -> list[str]:
    """Draw calls for every recorded function and write them as `differential` writes its own
    (inputs stream, manifest, expected outputs apart); the notes say what was skipped and why."""
    notes: list[str] = []
    manifest: list[dict[str, Any]] = []
    plans: dict[str, Any] = {}
    stream = callfiles.Stream(folder, "inputs")
    (folder / "expected").mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():  # outputs decide here, not warnings (an ini may make them errors)
            warnings.simplefilter("ignore")
            for name, mine in _by_function(calls):
                p = plan(mine)
                if isinstance(p, str):
                    notes.append(f"property-based inputs: skipped {name}(): {p}")
                    continue
                try:
                    kept = draw(p, mine[0].function)
                except NoDraws as e:
                    notes.append(f"property-based inputs: skipped {name}(): {e}")
                    continue
                plans[name] = p.to_json()
                kept.sort(key=lambda k: sum(x.size for x in k[0].inputs.values()))
                fn = mine[0].function
                for drawn, outputs in kept:
                    mode, outputs = _in_mode(p, fn, drawn, outputs, len(manifest))
                    _write(f"d{len(manifest)}", drawn, outputs, stream, folder)
                    manifest.append(_entry(p, drawn, outputs, len(manifest), mode))
                for drawn, outputs in large.calls(p, fn, [c.scalars for c in mine]):
                    _write(f"d{len(manifest)}", drawn, outputs, stream, folder)
                    manifest.append(_entry(p, drawn, outputs, len(manifest), is_large=True))
    finally:
        stream.close()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "plans.json").write_text(json.dumps(plans))
    return notes


def _by_function(calls: list[Any]) -> Iterator[tuple[str, list[Any]]]:
    names: dict[str, list[Any]] = {}
    for c in calls:
        names.setdefault(c.function.name, []).append(c)
    yield from names.items()


def _in_mode(
    p: Plan, fn: KernelFunction, drawn: Drawn, outputs: dict[int, np.ndarray], n: int
) -> tuple[str, dict[int, np.ndarray]]:
    """The torch mode drawn call `n` is made in (the modes in turn, for torch kernels) and the
    committed kernel's outputs in it; the default where it fails in that mode (not supported)."""
    mode = GRAD_MODES[n % len(GRAD_MODES)] if torchmodes.is_torch(p.kinds) else "default"
    if mode == "default":
        return mode, outputs
    values = call_arguments(p, fn, drawn)
    values = torchmodes.prepared(values, list(drawn.inputs), mode)
    try:
        with torchmodes.entered(mode, values):
            fn.raw(*values)
    except Exception:  # the committed kernel does not support the mode: not held against a candidate
        return "default", outputs
    found = written_outputs(fn, values)
    return (mode, found) if found is not None else ("default", outputs)


def _write(
    key: str, drawn: Drawn, outputs: dict[int, np.ndarray], stream: callfiles.Stream, folder: Path
) -> None:
    """A drawn call's inputs to the stream candidates replay, its outputs apart (the controller's)."""
    for i, x in drawn.inputs.items():
        stream.write(f"{key}-a{i}", x)
    np.savez(folder / "expected" / f"{key}.npz", **{f"a{i}": o for i, o in outputs.items()})  # type: ignore[arg-type]


def _entry(
    p: Plan,
    drawn: Drawn,
    outputs: dict[int, np.ndarray],
    n: int,
    mode: str = "default",
    is_large: bool = False,
) -> dict[str, Any]:
    return {
        "key": f"d{n}",
        "function": p.function,
        "test": large.TEST if is_large else TEST,
        "transform": f"{'large' if is_large else 'drawn'} input #{n} ({drawn.summary})",
        "inputs": {str(i): [list(x.shape), x.dtype.str] for i, x in drawn.inputs.items()},
        "outputs": {str(i): [list(o.shape), o.dtype.str] for i, o in outputs.items()},
        "scalars": {str(i): v for i, v in drawn.scalars.items()},
        "kinds": {str(i): k for i, k in p.kinds.items()},
        "repeats": 1,
        "input_peak": drawn.peak,
        "equal_run": drawn.equal_run,
        "concurrent": False,
        "grad_mode": mode,
        "choices": drawn.choices,
        "own_error": drawn.own_error,
    }


def failing_key(finding: str) -> str | None:
    """The key of the drawn call a differential finding names, if it names one."""
    found = re.search(r"drawn input #(\d+) ", finding)
    return f"d{found.group(1)}" if found and TEST in finding else None


def shrink(
    folder: Path,
    key: str,
    candidate: Mapping[str, KernelFunction],
    committed: Mapping[str, KernelFunction],
    rtol: float,
) -> str:
    """In a child holding both kernels: the smallest input Hypothesis reaches from drawn call `key`
    on which the candidate still differs from the committed kernel, in one line ("" if none)."""
    from hypothesis import Phase, assume, given

    entry = next(e for e in json.loads((folder / "manifest.json").read_text()) if e["key"] == key)
    p = Plan.from_json(json.loads((folder / "plans.json").read_text())[entry["function"]])
    mine, oracle = candidate[p.function], committed[p.function]
    smallest: list[str] = []
    deadline = time.monotonic() + SHRINK_S

    @_settings(database=_Replayed(entry["choices"]), phases=[Phase.reuse, Phase.shrink], max_examples=1)
    @given(strategy(p))
    def differs(drawn: Drawn) -> None:
        if time.monotonic() > deadline:
            return  # out of time: no further input is smaller, the last one found stands
        want_values = call_arguments(p, oracle, drawn)
        oracle.raw(*want_values)
        want = written_outputs(oracle, want_values)
        assume(want is not None)
        assert want is not None
        got_values = call_arguments(p, mine, drawn)
        mine.raw(*got_values)
        read = sum(x.size for x in drawn.inputs.values() if x.dtype.kind in "fc")
        written = sum(w.size for w in want.values())
        for i, w in want.items():
            got = arrays.host_copy(got_values[i])
            assert got is not None  # an array argument
            # the floor the differential check forgave when it found this call: a smaller input must
            # differ beyond rounding too, or the shrink ends on a call only rounding tells apart
            floor = (
                arrays.rounding_floor(drawn.peak, read, written, w.dtype, drawn.equal_run, arrays.peak(w))
                if w.dtype.kind == "f"
                else 0.0
            )
            why = arrays.mismatch(got, w, rtol + float(entry.get("own_error", 0.0)), floor)
            if why:
                smallest.append(f"{p.function}({drawn.summary}): output #{i}: {why}")
                raise AssertionError(why)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            differs()
        except Exception:  # noqa: S110 - the failure itself, or Hypothesis saying it was flaky
            pass
    return smallest[-1] if smallest else ""


def _replayed_database(choices: list[int]) -> Any:
    from hypothesis.database import ExampleDatabase, choices_to_bytes

    class Replayed(ExampleDatabase):
        """Offers one choice sequence and keeps nothing: no `.hypothesis` folder."""

        def __init__(self) -> None:
            super().__init__()
            self.blob = choices_to_bytes(choices)

        def fetch(self, key: bytes) -> Iterator[bytes]:
            # as a past failure not yet shrunk (the secondary corpus): Hypothesis takes the primary
            # corpus's entries for shrunk already, and would only replay it
            if key.endswith(b".secondary"):
                yield self.blob

        def save(self, key: bytes, value: bytes) -> None:
            pass

        def delete(self, key: bytes, value: bytes) -> None:
            pass

    return Replayed()


_Replayed = _replayed_database
