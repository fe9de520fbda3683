"""The `kope:` header of a kernel source: its kernels, tuning space and constraints.

Any comment line whose text starts with ``kope:`` is a declaration (``//``, ``#``, ``/*``, `` *``
prefixes all work, so C and Python sources use the same syntax)::

    // kope: kernel void softmax(const float *x, float *y, int rows, int cols)
    // kope: param BLOCK = 8 | 16 | 32        first value is the default
    // kope: flags -O2 | -O3 -march=native    compiler flag sets, first is the default
    // kope: require BLOCK % UNROLL == 0      a condition over the params (see below)
    // kope: inplace y                        a pointer argument that is read and written

The defaults build the committed kernel; every other point of the space is a candidate the tuner may try.

A ``require`` line is read by a fixed grammar, never run as Python (the header may be a candidate's):
param names, numbers, strings, comparisons (``== != < <= > >= in``, ``not in``), ``and``/``or``/``not``,
arithmetic (``+ - * / // % **``, small exponents) and literal lists for ``in``. A point on which a
condition cannot be evaluated (a division by zero, a type mismatch) is ruled out.
"""

from __future__ import annotations

import ast
import difflib
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .errors import SpecError
from .requires import Scalar as _Scalar
from .requires import evaluate_require, require_error

_LINE = re.compile(r"^\s*(?://+|#+|/\*+|\*+)?\s*kope:\s*(?P<body>.*?)\s*(?:\*/)?\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DECLARATIONS = ("kernel", "param", "flags", "require", "inplace")
FLAGS = "flags"

Scalar = _Scalar  # a param value, and any value a `require` condition computes (bool is an int)
Point = dict[str, Scalar]  # a tuning point: axis name -> value (a candidate's defines and `flags`)


def as_point(data: Mapping[str, object]) -> Point:
    """A point read from JSON or the graph, checked once: int, float and str values kept as they are
    (bool is an int); a ValueError names the first key whose value is none of them."""
    if not isinstance(data, Mapping):  # JSON gives whatever the file holds
        raise ValueError(f"tuning point: {data!r} is not a mapping of axis names to values")
    point: Point = {}
    for key, value in data.items():
        if not isinstance(value, (int, float, str)):
            raise ValueError(f"tuning point: {key}={value!r} is not a number or a string")
        point[key] = value
    return point


def _value(text: str) -> Scalar:
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return v if isinstance(v, (int, float, str)) else text


@dataclass(frozen=True)
class TuningSpace:
    """Named axes, each a list of values whose first entry is the default."""

    axes: Mapping[str, tuple[Scalar, ...]] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    @property
    def defaults(self) -> Point:
        return {name: values[0] for name, values in self.axes.items()}

    def size(self) -> int:
        n = 1
        for values in self.axes.values():
            n *= len(values)
        return n

    def allows(self, point: Mapping[str, object]) -> bool:
        if any(name not in point or point[name] not in vals for name, vals in self.axes.items()):
            return False
        return all(evaluate_require(expr, point) for expr in self.requires)

    def points(self) -> Iterator[Point]:
        names = list(self.axes)
        for combo in itertools.product(*(self.axes[n] for n in names)):
            point = dict(zip(names, combo))
            if self.allows(point):
                yield point


@dataclass(frozen=True)
class SourceFlags:
    """A kernel the repo builds itself: the `flags` its build passes on the command line (the axis's
    first value) and the compiler that build runs (command, where the build names it), for which
    every other value is written into the source (`toolchains/flagblock.py`)."""

    held: str
    compiler: tuple[str, str]


@dataclass(frozen=True)
class KernelSpec:
    """Everything the header of one source declares."""

    kernels: tuple[str, ...] = ()
    space: TuningSpace = field(default_factory=TuningSpace)
    inplace: frozenset[str] = frozenset()
    # Not from the header: the operator's build context, set by the builder from the marker and ini.
    include_dirs: tuple[str, ...] = ()  # absolute, read-only: the repo's headers a kernel may include
    companions: tuple[str, ...] = ()  # absolute paths of the operator's other sources, built alongside
    build: tuple[str, str, str, str] | None = None  # the repo's own build: command, root, target, library
    source_flags: SourceFlags | None = None  # the repo builds it itself: flags go into the source


def parse_spec(text: str, filename: str = "<source>") -> KernelSpec:
    """Parse the `kope:` lines of a kernel source; raise SpecError naming the file and line."""
    kernels: list[str] = []
    axes: dict[str, tuple[Scalar, ...]] = {}
    requires: list[tuple[str, str]] = []  # (where, expression): names are checked once all params are known
    inplace: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _LINE.match(line)
        if not m:
            continue
        body = m.group("body")
        word, _, rest = body.partition(" ")
        rest = rest.strip()
        where = f"{filename}:{lineno}"
        if word == "kernel":
            kernels.append(rest.rstrip(";"))
        elif word == "param":
            name, eq, values = rest.partition("=")
            name = name.strip()
            if not eq or not _NAME.match(name):
                raise SpecError(f"{where}: write `kope: param NAME = default | other | ...`, got {body!r}")
            axes[name] = _choices(values, where, f"param {name} = ")
            _one_value_each(values, where, name)
        elif word == "flags":
            axes[FLAGS] = tuple(str(v) for v in _choices(rest, where, "flags ", literal=False))
        elif word == "require":
            requires.append((where, rest))
        elif word == "inplace":
            inplace.update(rest.replace(",", " ").split())
        else:
            close = difflib.get_close_matches(word, _DECLARATIONS, 1)
            raise SpecError(
                f"{where}: unknown declaration {word!r}"
                + (f" (did you mean `kope: {close[0]}`?)" if close else "")
                + "; use kernel, param, flags, require or inplace"
            )
    for where, expr in requires:
        why = require_error(expr, axes)
        if why:
            raise SpecError(f"{where}: {why}; write e.g. `kope: require VEC <= 8 or THREADS == 1`")
    return KernelSpec(tuple(kernels), TuningSpace(axes, tuple(e for _, e in requires)), frozenset(inplace))


def _choices(text: str, where: str, lead: str, literal: bool = True) -> tuple[Scalar, ...]:
    """The `a | b | c` of a `param` or `flags` line (`lead`: its words before the choices)."""
    parts = [p.strip() for p in text.split("|")]
    if not parts or any(p == "" for p in parts):
        raise SpecError(
            f"{where}: list choices as `kope: {lead}a | b | c` (first is the default), got {text.strip()!r}"
        )
    values = tuple(_value(p) for p in parts) if literal else tuple(parts)
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: repeated value in {text!r}")
    return values


def _one_value_each(text: str, where: str, name: str) -> None:
    """A `param` choice that is a list itself (`VEC = 0, 8, 16`, or `0 8 16`) would build as one
    `-DVEC=0, 8, 16` and fail far from here; a quoted string or an expression (`64 * 4`) is one value."""
    listed = [w for w in re.split(r"[,;|\s]+", text.strip()) if w]
    for raw in (r.strip() for r in text.split("|")):
        if raw[:1] not in "'\"" and re.fullmatch(r"[\w.+-]+(?:[,;\s]+[\w.+-]+)+", raw):
            raise SpecError(
                f"{where}: separate the choices of param {name} with `|`, not commas or spaces:"
                f" write `kope: param {name} = {' | '.join(listed)}` (first is the default)"
            )


def bake_defaults(text: str, point: Mapping[str, Scalar]) -> str:
    """The source with `point` made the declared default, so the committed file builds the winner.

    Each axis keeps all its values; the chosen one moves to the front. Axes not in `point` are untouched.
    """
    out = []
    for line in text.splitlines(keepends=True):
        m = _LINE.match(line)
        if m:
            body = m.group("body")
            word, _, rest = body.partition(" ")
            name = FLAGS if word == "flags" else rest.partition("=")[0].strip() if word == "param" else None
            if name is not None and name in point:
                head = line[: m.start("body")] + body[: len(word) + 1]
                lhs, values = ("", rest) if word == "flags" else (name + " = ", rest.partition("=")[2])
                choices = [v.strip() for v in values.split("|")]
                chosen = str(point[name])
                match = next((c for c in choices if str(_value(c)) == chosen or c == chosen), chosen)
                ordered = [match] + [c for c in choices if c != match]
                tail = line[m.end("body") :]
                line = f"{head}{lhs}{' | '.join(ordered)}{tail}"
        out.append(line)
    return "".join(out)
