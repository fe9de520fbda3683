"""The differential check: the committed kernel is a reference the repo already trusts, so use it.

1. A judging child that runs the operator's correctness tests with the committed kernel *records*
   each kernel call (its inputs as the test made them), then runs the committed kernel again on
   transformed copies: floating inputs scaled up and down by orders of magnitude, and offset. It
   writes the inputs and, apart, the committed kernel's outputs.
2. The controller reads those outputs into memory and deletes them before any candidate runs.
3. Each candidate's judging child *replays* every recorded input through the candidate under the same
   guards as a test, and writes the outputs. The untransformed ones run three times, with more OpenMP
   threads than cores, the last two at once on separate buffers where the committed kernel itself
   gives its answer that way: state a kernel shares between threads or calls is then overwritten for
   sure, where a lone call on a busy machine may never show the race; a few more pairs, made to
   overlap, must agree with lone calls.
4. The controller compares them with the committed kernel's, norm-wise: the decision is made by code
   the candidate never ran next to, whatever it did inside its own process. A transform on which the
   committed kernel itself is non-finite is skipped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import shutil
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...toolchains.base import IN, OUT, SCALAR, Arg, KernelFunction
from .. import arrays
from . import callfiles, drawing, overlap
from .guards import Call, SettleLater

# (name, factor, offset in units of the input's largest magnitude)
TRANSFORMS = (
    ("as tested", 1.0, 0.0),
    ("scaled x1000", 1e3, 0.0),
    ("scaled x0.001", 1e-3, 0.0),
    ("offset +100*max|x|", 1.0, 100.0),
)
RACE_REPEATS = 3  # replays of the untransformed calls
MAX_CALL_BYTES = 16 << 20
MAX_TOTAL_BYTES = 96 << 20
MAX_CALLS = 64
SETTLE_BATCH_BYTES = 64 << 20  # replay buffers held for one settle check before they are written
_Pending = list[tuple[dict[str, Any], list[tuple[Any, ...]], list[int]]]  # entry, argument sets, written


@dataclass
class Recorded:
    """The committed kernel's recorded calls: inputs on disk, outputs held by the controller."""

    function: KernelFunction
    test: str
    inputs: dict[int, np.ndarray]  # arg index -> host copy before the call (IN and INOUT)
    outputs: dict[int, tuple[tuple[int, ...], str]]  # OUT arg index -> shape, dtype
    scalars: dict[int, Any]
    kinds: dict[int, str]


class Recorder:
    """Collects the committed kernel's calls during a test run (installed as `guards.RECORDER`)."""

    def __init__(self) -> None:
        self.calls: list[Recorded] = []
        self.test = ""
        self.bytes = 0

    def __call__(self, fn: KernelFunction, values: tuple[Any, ...], inputs: dict[int, np.ndarray]) -> None:
        scalars = {i: _plain(v) for i, (a, v) in enumerate(zip(fn.args, values)) if a.role == SCALAR}
        size = sum(int(getattr(v, "nbytes", 0)) for v in values)
        if (
            len(self.calls) >= MAX_CALLS
            or size > MAX_CALL_BYTES
            or self.bytes + size > MAX_TOTAL_BYTES
            or any(v is None for v in scalars.values())
        ):
            return
        outputs: dict[int, tuple[tuple[int, ...], str]] = {}
        for i, (a, v) in enumerate(zip(fn.args, values)):
            if a.role == OUT:
                h = arrays.host_array(v)
                outputs[i] = (tuple(h.shape), h.dtype.str)
        kinds = {i: arrays.kind(v) for i, (a, v) in enumerate(zip(fn.args, values)) if a.role != SCALAR}
        self.calls.append(Recorded(fn, self.test, inputs, outputs, scalars, kinds))
        self.bytes += size

    def write(self, folder: Path) -> int:
        """Run the committed kernel on every transform of every recorded call; write inputs and outputs."""
        with warnings.catch_warnings():  # outputs decide here, not warnings (an ini may make them errors)
            warnings.simplefilter("ignore")
            count = self._write(folder)
        try:  # calls beyond the tests' (`draws.py`): what it skipped and why, for the report
            notes = drawing.write(self.calls, folder / "draws")
        except Exception as e:  # a fault of the drawing, never the committed kernel's verdict
            notes = [f"property-based inputs: none drawn: {type(e).__name__}: {str(e)[:200]}"]
        (folder / "notes.json").write_text(json.dumps(notes))
        return count

    def _write(self, folder: Path) -> int:
        (folder / "expected").mkdir(parents=True, exist_ok=True)
        stream = callfiles.Stream(folder, "inputs")
        try:
            manifest = self._run_transforms(folder, stream)
        finally:
            stream.close()
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return len(manifest)

    def _run_transforms(self, folder: Path, stream: callfiles.Stream) -> list[dict[str, Any]]:
        manifest = []
        for c, call in enumerate(self.calls):
            for t, (name, factor, offset) in enumerate(TRANSFORMS):
                inputs = {i: _transform(x, factor, offset) for i, x in call.inputs.items()}
                values = _values(call, inputs)
                call.function.raw(*values)
                outputs = {i: arrays.host_array(values[i], copy=True) for i in _written(call)}
                if t > 0 and not all(np.isfinite(o).all() for o in outputs.values() if o.dtype.kind == "f"):
                    continue  # the committed kernel itself breaks here: not held against a candidate
                key = f"{c}-{t}"
                for i, x in inputs.items():
                    stream.write(f"{key}-a{i}", x)
                named = {f"a{i}": o for i, o in outputs.items()}  # allow_pickle=True: the default, for mypy
                np.savez(folder / "expected" / f"{key}.npz", allow_pickle=True, **named)
                manifest.append(
                    {
                        "key": key,
                        "function": call.function.name,
                        "test": call.test,
                        "transform": name,
                        "inputs": {str(i): [list(x.shape), x.dtype.str] for i, x in inputs.items()},
                        "outputs": {str(i): [list(s), d] for i, (s, d) in call.outputs.items()},
                        "scalars": {str(i): v for i, v in call.scalars.items()},
                        "kinds": {str(i): k for i, k in call.kinds.items()},
                        "repeats": RACE_REPEATS if t == 0 else 1,
                        "input_peak": _peak(inputs.values()),
                        "concurrent": t == 0 and _reentrant(call, inputs, outputs),
                    }
                )
        return manifest


def take_expected(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """The committed kernel's outputs, read into memory and deleted from disk (candidates never see them)."""
    out = {}
    expected = folder / "expected"
    for path in sorted(expected.glob("*.npz")):
        with np.load(path, allow_pickle=False) as data:
            out[path.stem] = {k: np.array(data[k]) for k in data.files}
    shutil.rmtree(expected, ignore_errors=True)
    return out


def replay(folder: Path, functions: Mapping[str, Any], results: Path) -> list[str]:
    """In a candidate's child: run every recorded input through the candidate's guarded functions.

    Returns the guard violations and errors, one line each; outputs go to `results` as a stream
    (`callfiles`), each named `<key>-<rep>-a<i>`.
    """
    stream = callfiles.Stream(results, "outputs")
    # outputs decide here, not warnings (an ini may make them errors); one pool of threads for every
    # concurrent replay (a pool per call was a tenth of the replay)
    try:
        with warnings.catch_warnings(), ThreadPoolExecutor(RACE_REPEATS - 1) as pool:
            warnings.simplefilter("ignore")
            return _replay(folder, functions, stream, pool)
    finally:
        stream.close()


def _replay(
    folder: Path, functions: Mapping[str, Any], results: callfiles.Stream, pool: ThreadPoolExecutor
) -> list[str]:
    problems: list[str] = []
    pending: _Pending = []
    settle, held, race_deadline = SettleLater(), 0, time.monotonic() + overlap.RACE_SECONDS
    manifest = json.loads((folder / "manifest.json").read_text())
    recorded = callfiles.read(folder, "inputs", _input_layouts(manifest))
    racing = overlap.chosen(manifest)
    for entry in manifest:
        fn = functions.get(entry["function"])
        if fn is None:
            continue
        inputs = {int(i): recorded[f"{entry['key']}-a{i}"] for i in entry["inputs"]}
        written = [i for i, a in enumerate(fn.function.args) if a.role not in (IN, SCALAR)]
        sets = [_replay_values(fn.function.args, entry, inputs) for _ in range(entry["repeats"])]
        # the first run alone; the repeats at once, each on its own buffers, where the committed kernel
        # allows it: state shared between OpenMP threads (or calls) is then overwritten for sure
        together = sets[1:] if entry.get("concurrent") else []
        with _grad_mode(entry.get("grad_mode")):  # how users call a torch kernel too
            errors = _call_all(fn, sets[:1] + ([] if together else sets[1:]))
        errors += _call_together(fn, together, pool)
        if entry["key"] in racing and not errors:
            values_of = functools.partial(_replay_values, fn.function.args, entry)
            errors = overlap.pairs_agree(fn, values_of, inputs, sets[0], written, pool, race_deadline)
        if errors:
            problems.append(f"{_where(entry)}: {errors[0]}")
            continue
        for values in sets:
            settle.add(Call(fn.function, values))
        pending.append((entry, sets, written))
        held += sum(int(getattr(v, "nbytes", 0)) for values in sets for v in values)
        if held >= SETTLE_BATCH_BYTES:
            problems += _settled(settle, pending, results)
            pending, held = [], 0
    return problems + _settled(settle, pending, results)


def _input_layouts(manifest: list[dict[str, Any]]) -> dict[str, callfiles.Layout]:
    return {
        f"{entry['key']}-a{i}": (tuple(shape), np.dtype(dtype))
        for entry in manifest
        for i, (shape, dtype) in entry["inputs"].items()
    }


def _settled(
    settle: SettleLater,
    pending: _Pending,
    results: callfiles.Stream,
) -> list[str]:
    """Check that the pending calls' outputs stayed put (one wait for all), then write them."""
    changed = settle.check(named=True)
    if changed:
        return [f"differential check: {changed[0]}"]
    for entry, sets, written in pending:
        for rep, values in enumerate(sets):
            for i in written:
                results.write(f"{entry['key']}-{rep}-a{i}", arrays.host(values[i]))
    return []


def _grad_mode(mode: str | None) -> Any:
    """torch's `no_grad` or `inference_mode` for a drawn call that names one, else nothing."""
    if mode not in ("no_grad", "inference_mode"):
        return contextlib.nullcontext()
    import torch

    return getattr(torch, mode)()


def _call_all(fn: Any, sets: list[tuple[Any, ...]]) -> list[str]:
    for values in sets:
        if errors := overlap.call_named(fn, values):
            return errors
    return []


def _call_together(fn: Any, sets: list[tuple[Any, ...]], pool: ThreadPoolExecutor) -> list[str]:
    """Call `fn` on every set at the same time, one thread each (kernels release the GIL)."""
    if not sets:
        return []
    found = list(pool.map(lambda values: overlap.call_named(fn, values), sets))
    return [e for errors in found for e in errors]


def compare(
    manifest: list[dict[str, Any]],
    expected: Mapping[str, Mapping[str, np.ndarray]],
    results: Path,
    rtol: float,
) -> list[str]:
    """In the controller: where the candidate's replayed outputs differ from the committed kernel's
    (`manifest` and `expected` as the controller read them before any candidate ran)."""
    layouts = {
        f"{entry['key']}-{rep}-{name}": callfiles.layout(w)
        for entry in manifest
        for rep in range(entry["repeats"])
        for name, w in expected.get(entry["key"], {}).items()
    }
    try:
        replayed = callfiles.read(results, "outputs", layouts)
    except (ValueError, OSError) as e:
        return [f"differential check: unreadable output ({e})"]
    for entry in manifest:
        want = expected.get(entry["key"], {})
        for rep in range(entry["repeats"]):
            prefix = f"{entry['key']}-{rep}-"
            got = {name: replayed[prefix + name] for name in want if prefix + name in replayed}
            if not got:
                return [f"{_where(entry)}: the candidate gave no output (run {rep + 1})"]
            for name, w in want.items():
                floor = rounding_floor(entry, w.dtype) if w.dtype.kind == "f" else 0.0
                why = arrays.mismatch(got[name], w, rtol, floor) if name in got else "missing"
                if why:
                    run = (
                        f", run {rep + 1} of {entry['repeats']} (the repeats at once, with more threads than cores)"
                        if entry["repeats"] > 1
                        else ""
                    )
                    return [f"{_where(entry)}{run}: output #{name[1:]}: {why}"]
    return []


def rounding_floor(entry: Mapping[str, Any], dtype: np.dtype[Any]) -> float:
    """The largest error that is only rounding, for a call's outputs of `dtype`: the float resolution
    of its largest input, times how many input elements each output element can sum (input over
    output elements: 1 for elementwise, the row length for a row sum).

    One gelu of x = -8 is 0 from the committed tanhf and 2e-9 from an exp-based candidate: one ulp of
    the input. A drawn row that mixes +-2^32 with small values sums, in any order, with each small
    value absorbed or not by a partial sum near 2^32, so honest orders differ by up to one ulp of 2^32
    per element: an honest vectorized row sum differed from the sequential one by 1.05 ulp on 8,199
    values in one CI run and by 111 ulps on 6,945 mostly positive values in another (numpy: 160-175).
    The bound for any summation order grows with the count of terms, not its square root."""
    read = sum(math.prod(shape) for shape, kind in entry.get("inputs", {}).values() if kind[1:2] in "fc")
    written = sum(math.prod(shape) for shape, _ in entry.get("outputs", {}).values())
    return arrays.rounding_floor(float(entry.get("input_peak", 0.0)), read, written, dtype)


def _where(entry: dict[str, Any]) -> str:
    return f"differential check vs the committed kernel, {entry['function']}() inputs of {entry['test'] or 'a test'} {entry['transform']}"


def _magnitude(x: np.ndarray) -> float:
    """The largest finite magnitude of a floating array (0 when it holds none)."""
    finite = np.isfinite(x)
    return float(np.abs(x[finite]).max()) if finite.any() else 0.0


def _peak(arrays_in: Any) -> float:
    """The largest finite magnitude among a call's floating inputs (0 when there is none)."""
    return max((_magnitude(x) for x in arrays_in if x.dtype.kind == "f"), default=0.0)


def _transform(x: np.ndarray, factor: float, offset: float) -> np.ndarray:
    if x.dtype.kind != "f" or (factor == 1.0 and offset == 0.0):
        same: np.ndarray = x.copy()
        return same
    return arrays.scaled(x, factor, offset * (_magnitude(x) or 1.0))


def _values(call: Recorded, inputs: dict[int, np.ndarray]) -> tuple[Any, ...]:
    values: list[Any] = []
    for i, a in enumerate(call.function.args):
        if a.role == SCALAR:
            values.append(call.scalars[i])
        elif a.role == OUT:
            shape, dtype = call.outputs[i]
            values.append(arrays.rebuild(np.empty(shape, dtype=dtype), call.kinds[i]))
        else:
            values.append(arrays.rebuild(inputs[i], call.kinds[i]))
    return tuple(values)


def _replay_values(
    args: tuple[Arg, ...], entry: dict[str, Any], inputs: dict[int, np.ndarray]
) -> tuple[Any, ...]:
    values: list[Any] = []
    for i, a in enumerate(args):
        if a.role == SCALAR:
            values.append(entry["scalars"][str(i)])
        elif a.role == OUT:
            shape, dtype = entry["outputs"][str(i)]
            values.append(
                arrays.rebuild(np.empty(tuple(shape), dtype=np.dtype(dtype)), entry["kinds"][str(i)])
            )
        else:
            values.append(arrays.rebuild(inputs[i], entry["kinds"][str(i)]))
    return tuple(values)


def _reentrant(call: Recorded, inputs: dict[int, np.ndarray], expected: dict[int, np.ndarray]) -> bool:
    """Whether the committed kernel gives its own answer when called on two buffer sets at once: only
    then are candidates held to it (a repo may keep a kernel that is not thread-safe on purpose)."""
    if not call.function.reentrant:  # its toolchain says so: never tried, a lucky run would mislead
        return False
    sets = [_values(call, inputs) for _ in range(RACE_REPEATS - 1)]
    try:
        with ThreadPoolExecutor(len(sets)) as pool:
            list(pool.map(lambda values: call.function.raw(*values), sets))
    except Exception:  # not thread-safe after all: replays stay one at a time
        return False
    return all(
        not arrays.mismatch(arrays.host_array(values[i], copy=True), want, 1e-6)
        for values in sets
        for i, want in expected.items()
    )


def _written(call: Recorded) -> list[int]:
    return [i for i, a in enumerate(call.function.args) if a.role not in (IN, SCALAR)]


def _plain(v: Any) -> int | float | bool | None:
    if isinstance(v, (bool, int, float)):
        return v
    if hasattr(v, "item") and re.match(r"^[iufb]", getattr(getattr(v, "dtype", None), "kind", "") or ""):
        item: int | float | bool = v.item()
        return item
    return None
