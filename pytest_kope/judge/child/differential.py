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

import functools
import json
import math
import shutil
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import KernelDied, KernelTimeout
from ...toolchains.base import IN, OUT, SCALAR, Arg
from .. import arrays
from . import callfiles, overlap, refill, torchmodes
from .guards import Call, GuardedFunction, SettleLater
from .recorder import RACE_REPEATS, TRANSFORMS, Recorded, Recorder

__all__ = [
    "RACE_REPEATS", "TRANSFORMS", "Recorded", "Recorder", "ReplayDied", "compare", "replay", "rounding_floor", "take_expected"
]  # fmt: skip

SETTLE_BATCH_BYTES = 64 << 20  # replay buffers held for one settle check before they are written
_Pending = list[tuple[dict[str, Any], list[tuple[Any, ...]], list[int]]]  # entry, argument sets, written


def take_expected(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """The committed kernel's outputs, read into memory and deleted from disk (candidates never see them)."""
    out = {}
    expected = folder / "expected"
    for path in sorted(expected.glob("*.npz")):
        with np.load(path, allow_pickle=False) as data:
            out[path.stem] = {k: np.array(data[k]) for k in data.files}
    shutil.rmtree(expected, ignore_errors=True)
    return out


def replay(folder: Path, functions: Mapping[str, GuardedFunction], results: Path, races: bool = True) -> list[str]:
    """In a candidate's child: run every recorded input through the candidate's guarded functions
    (`races`: with the overlapping pairs of `overlap.py` where the recording allows them).

    Returns the guard violations and errors, one line each; outputs go to `results` as a stream
    (`callfiles`), each named `<key>-<rep>-a<i>`.
    """
    stream = callfiles.Stream(results, "outputs")
    # outputs decide here, not warnings (an ini may make them errors); one pool of threads for every
    # concurrent replay (a pool per call was a tenth of the replay)
    try:
        with warnings.catch_warnings(), ThreadPoolExecutor(RACE_REPEATS - 1) as pool:
            warnings.simplefilter("ignore")
            return _replay(folder, functions, stream, pool, races)
    finally:
        stream.close()


def _replay(
    folder: Path,
    functions: Mapping[str, GuardedFunction],
    results: callfiles.Stream,
    pool: ThreadPoolExecutor,
    races: bool,
) -> list[str]:
    problems: list[str] = []
    pending: _Pending = []
    settle, held, race_deadline = SettleLater(), 0, time.monotonic() + overlap.RACE_SECONDS
    manifest = json.loads((folder / "manifest.json").read_text())
    recorded = callfiles.read(folder, "inputs", _input_layouts(manifest))
    racing = overlap.chosen(manifest) if races else set()
    loops: dict[str, tuple[Any, ...]] = {}  # the argument objects of each loop on refilled buffers
    for entry in manifest:
        fn = functions.get(entry["function"])
        if fn is None:
            continue
        inputs = {int(i): recorded[f"{entry['key']}-a{i}"] for i in entry["inputs"]}
        written = [i for i, a in enumerate(fn.function.args) if a.role not in (IN, SCALAR)]
        loop, step = entry["key"].rpartition("-f")[0], entry.get("refill")
        if step and loop in loops:  # the loop's next call: its last outputs checked and kept first
            problems += _settled(settle, pending, results)
            pending, held = [], 0
            refill.refill_into(loops[loop], fn.function.args, inputs)
            sets = [loops[loop]]
        else:
            sets = [_replay_values(fn.function.args, entry, inputs) for _ in range(entry["repeats"])]
            if step is not None:
                loops[loop] = sets[0]
        # the first run alone; the repeats at once, each on its own buffers, where the committed kernel
        # allows it: state shared between OpenMP threads (or calls) is then overwritten for sure
        together = sets[1:] if entry.get("concurrent") else []
        try:
            with torchmodes.entered(entry.get("grad_mode"), sets[0]):  # how users call a torch kernel too
                errors = _call_all(fn, sets[:1] + ([] if together else sets[1:]))
            errors += _call_together(fn, together, pool)
            if entry["key"] in racing and not errors:
                values_of = functools.partial(_replay_values, fn.function.args, entry)
                errors = overlap.pairs_agree(fn, values_of, inputs, sets[0], written, pool, race_deadline)
        except (KernelDied, KernelTimeout) as e:
            raise ReplayDied(
                type(e).__name__, f"{_where(entry)}: {type(e).__name__}: {str(e)[:1000]}"
            ) from None
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


class ReplayDied(Exception):
    """The candidate's kernel server died or hung in a replayed call: `kind` (KernelDied or
    KernelTimeout) decides the outcome, `text` names the call."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind, self.text = kind, text


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


def _call_all(fn: GuardedFunction, sets: list[tuple[Any, ...]]) -> list[str]:
    for values in sets:
        if errors := overlap.call_named(fn, values):
            return errors
    return []


def _call_together(fn: GuardedFunction, sets: list[tuple[Any, ...]], pool: ThreadPoolExecutor) -> list[str]:
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
            bar = rtol + float(
                entry.get("own_error", 0.0)
            )  # relaxed only by the committed kernel's own error
            for name, w in want.items():
                floor = rounding_floor(entry, w.dtype, arrays.peak(w)) if w.dtype.kind == "f" else 0.0
                why = arrays.mismatch(got[name], w, bar, floor) if name in got else "missing"
                if why:
                    run = (
                        f", run {rep + 1} of {entry['repeats']} (the repeats at once, with more threads than cores)"
                        if entry["repeats"] > 1
                        else ""
                    )
                    return [f"{_where(entry)}{run}: output #{name[1:]}: {why}"]
    return []


def rounding_floor(entry: Mapping[str, Any], dtype: np.dtype[Any], output_peak: float = 0.0) -> float:
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
    peak, run = float(entry.get("input_peak", 0.0)), int(entry.get("equal_run", 1))
    return arrays.rounding_floor(peak, read, written, dtype, run, output_peak)


def _where(entry: dict[str, Any]) -> str:
    return f"differential check vs the committed kernel, {entry['function']}() inputs of {entry['test'] or 'a test'} {entry['transform']}"


def _replay_values(
    args: tuple[Arg, ...], entry: dict[str, Any], inputs: dict[int, np.ndarray]
) -> tuple[Any, ...]:
    return torchmodes.prepared(_plain_values(args, entry, inputs), list(inputs), entry.get("grad_mode"))


def _plain_values(
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
