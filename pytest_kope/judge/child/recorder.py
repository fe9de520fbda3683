"""Recording the committed kernel's calls for the differential check (`differential.py` replays them).

In the committed kernel's correctness run each kernel call a test makes is recorded (its inputs as
the test made them). After the tests, the committed kernel runs again on each recorded call as
tested, on a loop of calls on the same buffers refilled in place (`refill.py`), on transformed
copies (scaled up and down by orders of magnitude, offset), and for torch kernels under the modes
users call in (`torchmodes.py`); each replay's inputs go to a stream, its outputs apart (the
controller takes them before any candidate runs), with the committed kernel's own error on it
(`noise.py`). Calls beyond the tests' are drawn next (`drawing.py`).
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...toolchains.base import IN, OUT, SCALAR, KernelFunction
from .. import arrays
from . import callfiles, drawing, draws, noise, refill, structure, torchmodes

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
        looped = refill.chosen(self.calls)
        for c, call in enumerate(self.calls):
            for variant in _variants(c, call, looped.get(c)):
                made = _entry(call, variant)
                if made is None:
                    continue  # the committed kernel itself breaks here: not held against a candidate
                entry, outputs = made
                for i, x in variant.inputs.items():
                    stream.write(f"{variant.key}-a{i}", x)
                named: dict[str, Any] = {f"a{i}": o for i, o in outputs.items()}
                # no allow_pickle=: numpy<2 (triton-ascend's) stores it as one more array, "allow_pickle"
                np.savez(folder / "expected" / f"{variant.key}.npz", **named)
                manifest.append(entry)
        return manifest


@dataclass(frozen=True)
class Variant:
    """One replay of a recorded call: its key and name, inputs, torch mode and scalar arguments."""

    key: str
    name: str
    inputs: dict[int, np.ndarray]
    scalars: dict[int, Any]
    mode: str | None = None

    @property
    def tested(self) -> bool:
        """The tests' own inputs and arguments (the committed kernel passed its tests on them)."""
        return self.key.endswith("-0") or self.key.endswith("-f0")


def _variants(c: int, call: Recorded, rank: int | None) -> Iterator[Variant]:
    """Each replay of recorded call `c`: as tested, the transforms, for torch kernels the modes users
    call in; for a call `refill.chosen` ranks, also the loop on refilled buffers (`refill.py`) and
    each floating scalar argument `draws.SCALAR_DECADES` decades up and down (an `eps` every test
    fixes), and for its function's largest (rank 0) each structure users' inputs have
    (`structure.given`: a -inf mask, equal rows, NaN...)."""
    same, chosen = dict(call.scalars), rank is not None
    yield Variant(f"{c}-0", TRANSFORMS[0][0], {i: x.copy() for i, x in call.inputs.items()}, same)
    if chosen:
        for step, (what, inputs) in enumerate(refill.steps(call.inputs, c)):
            yield Variant(f"{c}-f{step}", refill.entry_name(step, what), inputs, same)
    for t, (name, factor, offset) in enumerate(TRANSFORMS[1:], 1):
        yield Variant(
            f"{c}-{t}", name, {i: _transform(x, factor, offset) for i, x in call.inputs.items()}, same
        )
    for m, (name, mode) in enumerate(torchmodes.TRANSFORMS if torchmodes.is_torch(call.kinds) else ()):
        yield Variant(f"{c}-m{m}", name, {i: x.copy() for i, x in call.inputs.items()}, same, mode)
    for j, v in call.scalars.items() if chosen else ():
        if type(v) is float and v != 0.0:
            for way, factor in (("up", 10**draws.SCALAR_DECADES), ("down", 10**-draws.SCALAR_DECADES)):
                name = f"as tested, scalar argument #{j} = {v * factor:g} (x{factor:g})"
                yield Variant(
                    f"{c}-s{j}{way}",
                    name,
                    {i: x.copy() for i, x in call.inputs.items()},
                    {**same, j: v * factor},
                )
    for k, kind in enumerate(structure.KINDS["any"][1:] if rank == 0 else ()):
        laid = {i: structure.given(x, kind, draws.domain_of(x)) for i, x in call.inputs.items()}
        inputs = {i: x.copy() if (y := laid[i]) is None else y for i, x in call.inputs.items()}
        if any(y is not None for y in laid.values()):
            yield Variant(f"{c}-k{k}", f"as tested, with {kind}", inputs, same)


def _entry(call: Recorded, variant: Variant) -> tuple[dict[str, Any], dict[int, np.ndarray]] | None:
    """The manifest entry of one replay and the committed kernel's outputs, with its own error on the
    call (`noise.py`); None where the committed kernel fails, or is non-finite or not robust to its
    inputs' rounding, on anything but the tests' own inputs."""
    key, inputs = variant.key, variant.inputs
    outputs = _run(call, variant, inputs)
    if outputs is None or (not variant.tested and not _finite(outputs)):
        return None
    own = noise.own_error(lambda moved: _run(call, variant, moved), inputs, outputs)
    if own is None and not variant.tested:
        return None
    step = int(key.rpartition("-f")[2]) if "-f" in key else None
    entry = {
        "key": key,
        "function": call.function.name,
        "test": call.test,
        "transform": variant.name,
        "inputs": {str(i): [list(x.shape), x.dtype.str] for i, x in inputs.items()},
        "outputs": {str(i): [list(s), d] for i, (s, d) in call.outputs.items()},
        "scalars": {str(i): v for i, v in variant.scalars.items()},
        "kinds": {str(i): k for i, k in call.kinds.items()},
        "repeats": RACE_REPEATS if key.endswith("-0") else 1,
        "input_peak": _peak(inputs.values()),
        "equal_run": arrays.longest_run(inputs.values()),
        "concurrent": key.endswith("-0") and _reentrant(call, inputs, outputs),
        "own_error": own or 0.0,
        **({"refill": step} if step is not None else {}),
        **({"grad_mode": variant.mode} if variant.mode else {}),
    }
    return entry, outputs


def _run(call: Recorded, variant: Variant, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray] | None:
    """The committed kernel's written outputs on `inputs` with the variant's arguments and torch mode;
    None where it raises beyond the tests' own call (a mode or an argument it does not support)."""
    values = torchmodes.prepared(_values(call, inputs, variant.scalars), list(inputs), variant.mode)
    try:
        with torchmodes.entered(variant.mode, values):
            call.function.raw(*values)
    except Exception:  # only beyond the tests' own calls: the committed kernel does not support it
        if variant.tested:
            raise
        return None
    return {i: arrays.host_array(values[i], copy=True) for i in _written(call)}


def _finite(outputs: dict[int, np.ndarray]) -> bool:
    return all(np.isfinite(o).all() for o in outputs.values() if o.dtype.kind == "f")


def _peak(arrays_in: Any) -> float:
    """The largest finite magnitude among a call's floating inputs (0 when there is none)."""
    return max((arrays.peak(x) for x in arrays_in if x.dtype.kind == "f"), default=0.0)


def _transform(x: np.ndarray, factor: float, offset: float) -> np.ndarray:
    if x.dtype.kind != "f" or (factor == 1.0 and offset == 0.0):
        same: np.ndarray = x.copy()
        return same
    return arrays.scaled(x, factor, offset * (arrays.peak(x) or 1.0))


def _values(
    call: Recorded, inputs: dict[int, np.ndarray], scalars: dict[int, Any] | None = None
) -> tuple[Any, ...]:
    values: list[Any] = []
    for i, a in enumerate(call.function.args):
        if a.role == SCALAR:
            values.append((call.scalars if scalars is None else scalars)[i])
        elif a.role == OUT:
            shape, dtype = call.outputs[i]
            values.append(arrays.rebuild(np.empty(shape, dtype=dtype), call.kinds[i]))
        else:
            values.append(arrays.rebuild(inputs[i], call.kinds[i]))
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
