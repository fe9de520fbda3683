"""Property-based inputs beyond the tests', drawn by Hypothesis, with the committed kernel as oracle.

In the committed kernel's recording child, each kernel function whose buffers' sizes follow from its
integer arguments on every recorded call (`shapes.py`) gets new calls: sizes the tests never use
(larger, odd, prime, one), floating inputs whose magnitudes are drawn over a continuous range
(10**(c ± s), c in [-3, 3], s up to 3 decades, at random or rising along the buffer so one call
sweeps every band; signs, zeros), special values (subnormals, signed zeros, large) and the structure
users' inputs have (`structure.py`: equal rows, zero and constant blocks, -inf masks, NaN, +-inf,
denormals), in the domain the recorded inputs show (non-negative, positive, integer-valued); every
floating scalar argument varied within two decades of its recorded values (an `eps` the tests fix is
one a kernel may ignore). A call is kept only where the committed kernel writes every output, stays
finite, and stays so when its inputs move by their rounding (`noise.py`, whose measure of the
committed kernel's own error on the call goes with it), then a few calls larger than any drawn
here (`large.py`). Kept calls are written like the recorded ones (`differential.py`, `draws/`):
candidates replay them in their own child and the controller compares, out of the candidate's reach.

Hypothesis only draws there, it does not judge. When the controller finds a drawn call a candidate
gets wrong, a child holding the candidate and the committed kernel replays that draw's choices
through Hypothesis and lets it shrink them: the minimal input it reaches goes into the failure
message (the verdict was already made; the message only explains it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ...toolchains.base import IN, OUT, SCALAR, KernelFunction
from .. import arrays
from . import shapes, structure, torchmodes

MAX_ELEMENTS = 1 << 18  # per buffer of a drawn call: a call stays cheap to replay
MAX_KEPT = 150  # drawn calls kept per function
KEPT_KERNEL_S = 0.1  # the committed kernel's time over one function's kept calls: a candidate's replay
DRAW_S = 5.0  # the recording child's wall time drawing for one function, at most
MAX_EXAMPLES = 600  # Hypothesis examples tried per function (many are filtered out)
SHRINK_S = 3.0  # the failing child's wall time shrinking
GRAD_MODES = torchmodes.MODES  # torch kernels are called in each, in turn
SCALAR_DECADES = 2.0  # a floating scalar argument is drawn this many decades around its recorded values
TEST = "no test (drawn by Hypothesis)"


@dataclass(frozen=True)
class Buffer:
    """A floating input's dtype and the domain its recorded values show."""

    dtype: str
    domain: str  # "any" | "nonneg" | "positive" | "integer"
    low: float  # the recorded range, for integer-valued buffers
    high: float


@dataclass(frozen=True)
class Plan:
    """How to draw one function's calls (JSON: the failing child rebuilds the same strategy)."""

    function: str
    sizes: dict[int, list[int]]  # varying integer argument -> [step, top units, *special units]
    fixed: dict[int, list[Any]]  # other scalar arguments -> the recorded values
    dims: dict[int, list[list[Any]]]
    flat: dict[int, list[Any]]
    buffers: dict[int, Buffer]  # floating inputs
    outputs: dict[int, str]  # OUT arguments -> dtype
    kinds: dict[int, str]
    ranges: dict[int, list[float]] = field(default_factory=dict)  # floating scalars -> [low, high]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(
            data["function"],
            _ints(data["sizes"]),
            _ints(data["fixed"]),
            _ints(data["dims"]),
            _ints(data["flat"]),
            {int(k): Buffer(**v) for k, v in data["buffers"].items()},
            _ints(data["outputs"]),
            _ints(data["kinds"]),
            _ints(data.get("ranges", {})),
        )

    @property
    def rules(self) -> shapes.Rules:
        """The sizing rules, back as `shapes.Rules`."""
        return shapes.Rules(
            {i: tuple((str(k), int(n)) for k, n in d) for i, d in self.dims.items()},
            {i: (int(c), tuple(a)) for i, (c, a) in self.flat.items()},
            tuple(self.sizes),
        )


def plan(calls: list[Any]) -> Plan | str:
    """How to draw calls of one function from its recorded calls (`differential.Recorded`), or why not."""
    fn: KernelFunction = calls[0].function
    ints = [i for i, v in calls[0].scalars.items() if type(v) is int]
    sized = []
    for c in calls:
        found = {i: x.shape for i, x in c.inputs.items()} | {i: s for i, (s, _) in c.outputs.items()}
        sized.append(shapes.Sized({i: c.scalars[i] for i in ints}, found))
    rules = shapes.infer(sized)
    if isinstance(rules, str):
        return rules
    buffers = {}
    for i in sorted(calls[0].inputs):
        dtype = calls[0].inputs[i].dtype
        if dtype.kind != "f":
            return f"argument #{i} is a {dtype} buffer: the range its values may take is unknown"
        buffers[i] = _buffer(dtype, [c.inputs[i] for c in calls])
    sizes = {j: _sizes([c.scalars[j] for c in calls]) for j in rules.varying}
    fixed = {i: sorted({c.scalars[i] for c in calls}) for i in calls[0].scalars if i not in sizes}
    ranges = {i: r for i, values in fixed.items() if (r := _range(values))}
    outputs = {i: d for i, (_, d) in calls[0].outputs.items()}
    if any(a.role == OUT for a in fn.args) and not outputs:
        return "no output was recorded"
    return Plan(
        fn.name,
        sizes,
        fixed,
        {i: [list(p) for p in d] for i, d in rules.dims.items()},
        {i: [c, list(a)] for i, (c, a) in rules.flat.items()},
        buffers,
        outputs,
        dict(calls[0].kinds),
        ranges,
    )


def _range(values: list[Any]) -> list[float] | None:
    """[low, high] a floating scalar is drawn from: SCALAR_DECADES around its recorded magnitudes, its
    sign kept; None for other scalars, or recorded values of both signs or zero (nothing to scale)."""
    if not values or not all(type(v) is float for v in values):
        return None
    if not (all(v > 0 for v in values) or all(v < 0 for v in values)):
        return None
    low, high = min(abs(v) for v in values), max(abs(v) for v in values)
    sign = 1.0 if values[0] > 0 else -1.0
    return [sign * low / 10**SCALAR_DECADES, sign * high * 10**SCALAR_DECADES]


def _ints(d: dict[str, Any]) -> dict[int, Any]:
    """JSON's string keys back as argument indices."""
    return {int(k): v for k, v in d.items()}


def domain_of(x: np.ndarray) -> str:
    """The domain a recorded floating input's values show ("any", "nonneg", "positive", "integer")."""
    return _buffer(x.dtype, [x]).domain if x.dtype.kind == "f" else "integer"


def _buffer(dtype: np.dtype[Any], recorded: list[np.ndarray]) -> Buffer:
    values = np.concatenate([x.reshape(-1) for x in recorded]).astype(np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return Buffer(dtype.str, "any", 0.0, 0.0)
    low, high = float(values.min()), float(values.max())
    if np.array_equal(values, np.round(values)):
        domain = "integer"
    elif low > 0:
        domain = "positive"
    elif low >= 0:
        domain = "nonneg"
    else:
        domain = "any"
    return Buffer(dtype.str, domain, low, high)


def _sizes(values: list[int]) -> list[int]:
    """[step, top, *specials] in units of the step the recorded values share (their gcd)."""
    step = math.gcd(*values) or 1
    most = max(values) // step
    return [step, 2 * most + 1, 1, most + 1, 2 * most + 1, _prime_above(most)]


def _prime_above(n: int) -> int:
    k = n + 1
    while k < 3 or any(k % d == 0 for d in range(2, math.isqrt(k) + 1)):
        k += 1
    return k


class Choices:
    """Integers drawn from Hypothesis, kept in order: the draw's choice sequence, to replay it."""

    def __init__(self, draw: Callable[[Any], Any]):
        from hypothesis import strategies as st

        self.draw, self.integers = draw, st.integers
        self.taken: list[int] = []

    def __call__(self, low: int, high: int) -> int:
        value = int(self.draw(self.integers(low, high)))
        self.taken.append(value)
        return value


@dataclass
class Drawn:
    """One drawn call: its scalar arguments, its inputs, and Hypothesis's choices that made it; the
    longest run of equal values in its inputs (`equal_run`) widens the call's rounding floor."""

    scalars: dict[int, Any]
    inputs: dict[int, np.ndarray]
    choices: list[int]
    summary: str
    peak: float
    own_error: float = 0.0  # the committed kernel's own error on the call (`noise.py`), once measured

    @functools.cached_property
    def equal_run(self) -> int:  # noqa: D102 - said in the class's docstring
        return arrays.longest_run(self.inputs.values())


def strategy(p: Plan) -> Any:
    """The Hypothesis strategy of `p`'s calls (only integer draws: a choice sequence replays it)."""
    from hypothesis import assume
    from hypothesis import strategies as st

    @st.composite
    def calls(draw: Callable[[Any], Any]) -> Drawn:
        pick = Choices(draw)
        scalars: dict[int, Any] = {}
        for j, (step, top, *special) in p.sizes.items():
            which, units = (
                pick(0, len(special)),
                pick(1, top),
            )  # both always: `which` shrinks to 0, a size stays
            scalars[j] = step * (units if which == 0 else special[which - 1])
        for i, values in p.fixed.items():
            scalars[i] = values[pick(0, len(values) - 1) if len(values) > 1 else 0]
            if i in p.ranges and pick(0, 1):  # 0, what a shrink reaches: a recorded value
                low, high = p.ranges[i]
                scalars[i] = low * (high / low) ** (pick(0, 1000) / 1000)
        shaped = _capped(p, scalars)
        assume(shaped is not None)
        assert shaped is not None
        looks = {i: _look(pick, b) for i, b in p.buffers.items()}
        rng = np.random.default_rng(pick(0, (1 << 32) - 1))
        inputs = {
            i: drawn_values(rng, b, shaped[i], looks[i], row_length(p, scalars, i))
            for i, b in p.buffers.items()
        }
        summary = ", ".join(f"#{j}={scalars[j]}" for j in p.sizes)
        summary += "".join(f", #{j}={scalars[j]:.4g}" for j in p.ranges)
        summary += "".join(f"; input #{i}: {_say(b, looks[i], inputs[i])}" for i, b in p.buffers.items())
        peak = max((arrays.peak(x) for x in inputs.values()), default=0.0)
        return Drawn(scalars, inputs, pick.taken, summary, peak)

    return calls()


def _capped(p: Plan, scalars: dict[int, int]) -> dict[int, tuple[int, ...]] | None:
    """Every buffer's shape, the first sizes of an oversized buffer cut down (in their step) until
    it holds MAX_ELEMENTS at most: a wide row stays wide, with fewer rows. None: it cannot fit."""
    rules = p.rules
    for buffer in (*p.dims, *p.flat):
        for j in sorted(p.sizes):
            count = math.prod(rules.shape(scalars, buffer))
            if count <= MAX_ELEMENTS:
                break
            step = p.sizes[j][0]
            fewer = scalars[j] // math.ceil(count / MAX_ELEMENTS) // step * step
            if scalars[j] > step and j in _sized_by(rules, buffer):
                scalars[j] = max(step, fewer)
    shaped = {i: rules.shape(scalars, i) for i in (*p.dims, *p.flat)}
    return shaped if all(0 < math.prod(s) <= MAX_ELEMENTS for s in shaped.values()) else None


def _sized_by(rules: shapes.Rules, buffer: int) -> set[int]:
    """The integer arguments a buffer's size grows with."""
    if buffer in rules.dims:
        return {n for kind, n in rules.dims[buffer] if kind == "arg"}
    return set(rules.flat[buffer][1])


def _look(pick: Choices, b: Buffer) -> dict[str, Any]:
    """How a floating buffer's values look: log10 of the magnitude (centre, spread, at random or
    rising), signs, zeros, special values at positions."""
    if b.domain == "integer":
        return {}
    specials = _specials(b)
    # a spread of half a decade at least: a buffer of (nearly) equal values is ill-conditioned for
    # many honest kernels (a constant row's variance is rounding noise, which 1/sqrt(eps) amplifies),
    # and honest algorithms differ there by more than any tolerance; the tests' inputs are not like it
    look: dict[str, Any] = {"centre": pick(-300, 300) / 100, "spread": pick(50, 300) / 100}
    look["ramp"] = pick(0, 1) == 1  # magnitudes rising along the buffer: every band of the range in one call
    look["signs"] = ["mixed", "positive", "negative"][pick(0, 2)] if b.domain == "any" else "positive"
    look["zeros"] = b.domain != "positive" and pick(0, 1) == 1
    look["specials"] = [(specials[pick(0, len(specials) - 1)], pick(0, 1 << 20)) for _ in range(pick(0, 3))]
    kinds = structure.kinds(b.domain)
    look["structure"] = kinds[max(0, pick(0, 2 * len(kinds) - 2) - len(kinds) + 1)]  # half the calls: none
    return look


def row_length(p: Plan, scalars: dict[int, int], buffer: int) -> int:
    """The length of a buffer's rows: its last dimension, or for a flat buffer the last integer
    argument its size is the product of (what structure in rows means, `structure.py`)."""
    if buffer in p.dims:
        return int(p.rules.shape(scalars, buffer)[-1])
    _, args = p.flat[buffer]
    return int(scalars[max(args)]) if args else 0


def _specials(b: Buffer) -> list[float]:
    info = np.finfo(np.dtype(b.dtype))
    # large, yet its square and a few products stay finite: honest kernels that square their inputs
    # (norms, variances) overflow past sqrt(max) where the committed kernel may not, and differ there
    tiny, subnormal, large = float(info.smallest_subnormal), float(info.tiny) / 2, float(info.max) ** 0.25
    if b.domain == "positive":
        return [tiny, subnormal, large]
    if b.domain == "nonneg":
        return [0.0, tiny, subnormal, large]
    return [0.0, -0.0, tiny, -tiny, subnormal, large, -large]


def drawn_values(
    rng: np.random.Generator, b: Buffer, shape: tuple[int, ...], look: dict[str, Any], row: int = 0
) -> np.ndarray:
    """Values for `b` as `look` draws them, in rows of `row` elements (`structure.py`)."""
    n = math.prod(shape)
    if b.domain == "integer":
        values = rng.integers(math.floor(b.low), math.floor(b.high) + 1, n).astype(np.float64)
    else:
        where = np.linspace(-1.0, 1.0, n) if look["ramp"] else rng.uniform(-1.0, 1.0, n)
        values = 10.0 ** (look["centre"] + look["spread"] * where)
        if look["signs"] == "mixed":
            values *= rng.choice([-1.0, 1.0], n)
        elif look["signs"] == "negative":
            values = -values
        if look["zeros"]:
            values[rng.random(n) < 0.1] = 0.0
        for value, where in look["specials"]:
            values[where % n] = value
        tiny = float(np.finfo(np.dtype(b.dtype)).tiny)
        structure.apply(values, row, look.get("structure", structure.NONE), rng, tiny)
    return values.astype(np.dtype(b.dtype)).reshape(shape)


def _say(b: Buffer, look: dict[str, Any], x: np.ndarray) -> str:
    if b.domain == "integer":
        return f"{x.size} integers in [{b.low:g}, {b.high:g}]"
    spread = "rising in order over" if look["ramp"] else "±"
    said = (
        f"{x.size} values, |x| = 10^({look['centre']:g} {spread} {look['spread']:g}), {look['signs']} signs"
    )
    said += ", 10% zeros" if look["zeros"] else ""
    said += "".join(f", x[{w % x.size}] = {v:g}" for v, w in look["specials"])
    kind = look.get("structure", structure.NONE)
    return said + (f", {kind}" if kind != structure.NONE else "")


def call_arguments(p: Plan, fn: KernelFunction, drawn: Drawn) -> tuple[Any, ...]:
    """The call's arguments, outputs fresh and poisoned (an output left unwritten shows)."""
    rules = p.rules
    values: list[Any] = []
    for i, a in enumerate(fn.args):
        if a.role == SCALAR:
            values.append(drawn.scalars[i])
        elif a.role == OUT:
            out = arrays.rebuild(np.empty(rules.shape(drawn.scalars, i), np.dtype(p.outputs[i])), p.kinds[i])
            arrays.poison(out)
            values.append(out)
        else:
            values.append(arrays.rebuild(drawn.inputs[i], p.kinds[i]))
    return tuple(values)


def written_outputs(fn: KernelFunction, values: tuple[Any, ...]) -> dict[int, np.ndarray] | None:
    """The written outputs of a call, or None where one is non-finite or left unwritten."""
    out = {}
    for i, a in enumerate(fn.args):
        if a.role not in (SCALAR, IN):
            if arrays.unwritten(values[i]):
                return None
            h = arrays.host_copy(values[i])
            assert h is not None  # an array argument
            if h.dtype.kind == "f" and not np.isfinite(h).all():
                return None
            out[i] = h
    return out


def outputs_on(p: Plan, fn: KernelFunction, drawn: Drawn) -> dict[int, np.ndarray] | None:
    """The committed kernel's written, finite outputs on a drawn call (None: some are not)."""
    values = call_arguments(p, fn, drawn)
    fn.raw(*values)
    return written_outputs(fn, values)


def with_inputs(
    p: Plan, fn: KernelFunction, drawn: Drawn
) -> Callable[[dict[int, np.ndarray]], dict[int, np.ndarray] | None]:
    """`outputs_on` a drawn call's arguments with other inputs (what `noise.own_error` calls)."""
    return lambda moved: outputs_on(p, fn, replace(drawn, inputs=moved))
