"""The `kope:` header of a kernel source: its kernels, tuning space and constraints.

Any comment line whose text starts with ``kope:`` is a declaration (``//``, ``#``, ``/*``, `` *``
prefixes all work, so C and Python sources use the same syntax)::

    // kope: kernel void softmax(const float *x, float *y, int rows, int cols)
    // kope: param BLOCK = 8 | 16 | 32        first value is the default
    // kope: flags -O2 | -O3 -march=native    compiler flag sets, first is the default
    // kope: require BLOCK % UNROLL == 0      a Python expression over the params
    // kope: inplace y                        a pointer argument that is read and written

The defaults build the committed kernel; every other point of the space is a candidate the tuner may try.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .errors import SpecError

_LINE = re.compile(r"^\s*(?://+|#+|/\*+|\*+)?\s*kope:\s*(?P<body>.*?)\s*(?:\*/)?\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAGS = "flags"


def _value(text: str) -> int | float | str:
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return v if isinstance(v, (int, float, str)) else text


@dataclass(frozen=True)
class TuningSpace:
    """Named axes, each a list of values whose first entry is the default."""

    axes: Mapping[str, tuple] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    @property
    def defaults(self) -> dict:
        return {name: values[0] for name, values in self.axes.items()}

    def size(self) -> int:
        n = 1
        for values in self.axes.values():
            n *= len(values)
        return n

    def allows(self, point: Mapping) -> bool:
        if any(name not in point or point[name] not in vals for name, vals in self.axes.items()):
            return False
        env = {k: v for k, v in point.items() if _NAME.match(k)}
        try:
            return all(eval(expr, {"__builtins__": {}}, env) for expr in self.requires)  # noqa: S307
        except Exception:  # a constraint that cannot be evaluated on this point rules it out
            return False

    def points(self) -> Iterator[dict]:
        names = list(self.axes)
        for combo in itertools.product(*(self.axes[n] for n in names)):
            point = dict(zip(names, combo))
            if self.allows(point):
                yield point

    def merged(self, other: TuningSpace) -> TuningSpace:
        """This space widened by another (an LLM candidate may add knobs to the declared ones)."""
        axes = dict(self.axes)
        axes.update(other.axes)
        return TuningSpace(axes, tuple(dict.fromkeys(self.requires + other.requires)))


@dataclass(frozen=True)
class KernelSpec:
    """Everything the header of one source declares."""

    kernels: tuple[str, ...] = ()
    space: TuningSpace = field(default_factory=TuningSpace)
    inplace: frozenset[str] = frozenset()


def parse_spec(text: str, filename: str = "<source>") -> KernelSpec:
    """Parse the `kope:` lines of a kernel source; raise SpecError naming the file and line."""
    kernels: list[str] = []
    axes: dict[str, tuple] = {}
    requires: list[str] = []
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
            axes[name] = _choices(values, where)
        elif word == "flags":
            axes[FLAGS] = tuple(str(v) for v in _choices(rest, where, literal=False))
        elif word == "require":
            try:
                ast.parse(rest, mode="eval")
            except SyntaxError as e:
                raise SpecError(f"{where}: `kope: require` needs a Python expression: {e.msg}") from None
            requires.append(rest)
        elif word == "inplace":
            inplace.update(rest.replace(",", " ").split())
        else:
            raise SpecError(
                f"{where}: unknown declaration {word!r}; use kernel, param, flags, require or inplace"
            )
    return KernelSpec(tuple(kernels), TuningSpace(axes, tuple(requires)), frozenset(inplace))


def _choices(text: str, where: str, literal: bool = True) -> tuple:
    parts = [p.strip() for p in text.split("|")]
    if not parts or any(p == "" for p in parts):
        raise SpecError(f"{where}: list choices as `a | b | c` (first is the default), got {text!r}")
    values = tuple(_value(p) for p in parts) if literal else tuple(parts)
    if len(set(values)) != len(values):
        raise SpecError(f"{where}: repeated value in {text!r}")
    return values


def bake_defaults(text: str, point: Mapping) -> str:
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
            if name in point:
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
