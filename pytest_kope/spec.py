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
import functools
import itertools
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from .errors import SpecError

_LINE = re.compile(r"^\s*(?://+|#+|/\*+|\*+)?\s*kope:\s*(?P<body>.*?)\s*(?:\*/)?\s*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DECLARATIONS = ("kernel", "param", "flags", "require", "inplace")
FLAGS = "flags"

Scalar = int | float | str  # a param value, and any value a `require` condition computes (bool is an int)
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


# --- `kope: require`: a fixed grammar, checked when the header is parsed and interpreted node by node --------

MAX_EXPONENT = 64  # `**` with a larger exponent is refused (a constant one at parse time, any at run time)
MAX_INT_BITS = 4096  # an integer power that would be larger is an evaluation error (rules the point out)
_REQUIRE_GRAMMAR = "`kope: require` allows only params, numbers, comparisons, and/or/not and arithmetic"
# Operands of mixed types are a run-time matter (a TypeError rules the point out), so the tables take Any.
_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Scalar] | None] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: None,
}  # fmt: skip
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], object]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[Any], Scalar]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_FOUND = {
    ast.Call: "a call", ast.Attribute: "an attribute access", ast.Subscript: "a subscript",
    ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a comprehension", ast.JoinedStr: "an f-string",
    ast.FormattedValue: "an f-string", ast.IfExp: "a conditional expression", ast.NamedExpr: "an assignment",
    ast.Starred: "a starred expression", ast.Dict: "a dict", ast.Set: "a set", ast.Slice: "a slice",
    ast.Await: "an await", ast.Yield: "a yield", ast.YieldFrom: "a yield",
}  # fmt: skip


class _Refused(Exception):
    """A `require` expression outside the grammar (the message says what was found)."""


def _literal_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, bool)


def _check(node: ast.AST, names: Mapping[str, object] | None) -> None:
    """Raise _Refused unless `node` is in the grammar; `names` (when given) are the params it may use."""
    if isinstance(node, ast.Expression):
        return _check(node.body, names)
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float, str, bool):
            raise _Refused(f"the constant {node.value!r}")
        return None
    if isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise _Refused(f"the dunder name {node.id}")
        if names is not None and node.id not in names:
            raise _Refused(f"the name {node.id}, which is not a param of this source")
        return None
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, names)
        return None
    if isinstance(node, ast.UnaryOp):
        if type(node.op) not in _UNARY:
            raise _Refused(f"the operator {type(node.op).__name__}")
        return _check(node.operand, names)
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise _Refused(f"the operator {type(node.op).__name__} (bitwise operators are not allowed)")
        if isinstance(node.op, ast.Pow) and not (
            isinstance(node.right, ast.Name)
            or (_literal_number(node.right) and abs(ast.literal_eval(node.right)) <= MAX_EXPONENT)
        ):
            raise _Refused(f"a power whose exponent is not a param or a number of at most {MAX_EXPONENT}")
        _check(node.left, names)
        return _check(node.right, names)
    if isinstance(node, ast.Compare):
        _check(node.left, names)
        for op, right in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                raise _Refused(f"the comparison {type(op).__name__}")
            if isinstance(right, (ast.Tuple, ast.List)):
                if not isinstance(op, (ast.In, ast.NotIn)):
                    raise _Refused("a list outside `in`/`not in`")
                bad = [e for e in right.elts if not (_literal_number(e) or isinstance(e, ast.Constant))]
                if bad:
                    raise _Refused("a list with an element that is not a number or a string")
                for e in right.elts:
                    _check(e, names)
            else:
                _check(right, names)
        return None
    if isinstance(node, (ast.Tuple, ast.List)):
        raise _Refused("a list outside `in`/`not in`")
    raise _Refused(_FOUND.get(type(node), f"a {type(node).__name__} expression"))


@functools.lru_cache(maxsize=256)
def _parse_require(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise _Refused(f"a syntax error ({e.msg})") from None
    except ValueError as e:  # e.g. a NUL byte
        raise _Refused(f"unreadable text ({e})") from None
    _check(tree, None)
    return tree


def require_error(expr: str, params: Mapping[str, object] | None = None) -> str | None:
    """Why `expr` is not a valid `kope: require` condition over `params` (one line), or None if it is."""
    try:
        _check(_parse_require(expr), params)
    except _Refused as e:
        return f"{_REQUIRE_GRAMMAR}; found {e} in {expr.strip()!r}"
    except RecursionError:
        return f"{_REQUIRE_GRAMMAR}; found an expression nested too deeply"
    return None


def evaluate_require(expr: str, point: Mapping[str, object]) -> bool:
    """Whether `point` satisfies the condition `expr`; False when it is outside the grammar or fails."""
    try:
        return bool(_eval(_parse_require(expr).body, point))
    except Exception:  # a condition that cannot be evaluated on this point rules it out
        return False


def _power(base: Scalar, exp: Scalar) -> Scalar:
    if isinstance(base, str) or isinstance(exp, str) or abs(exp) > MAX_EXPONENT:
        raise ValueError("exponent out of range")
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and base.bit_length() * exp > MAX_INT_BITS:
        raise ValueError("power too large")
    result: Scalar = base**exp
    return result


def _arith(op: ast.operator, a: Scalar, b: Scalar) -> Scalar:
    strings = isinstance(a, str), isinstance(b, str)
    if any(strings) and not (all(strings) and isinstance(op, ast.Add)):  # no `"x" * 10**9`, no `%` formats
        raise TypeError("only + joins strings")
    binop = _BINOPS[type(op)]
    if binop is None:  # ast.Pow, bounded before it runs
        return _power(a, b)
    result = binop(a, b)
    if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
        raise ValueError("integer too large")
    return result


def _exact_scalar(value: object) -> TypeGuard[Scalar]:
    """Exactly an int, float, str or bool: a subclass (numpy's float64, say) is no `require` value."""
    return type(value) in (int, float, str, bool)


def _eval(node: ast.expr, env: Mapping[str, object]) -> Scalar:
    """Interpret one node of a checked expression (anything else raises, so it stays safe unchecked)."""
    if isinstance(node, ast.Constant) and _exact_scalar(node.value):
        return node.value
    if isinstance(node, ast.Name) and not node.id.startswith("__"):
        value = env[node.id]
        if not _exact_scalar(value):
            raise TypeError(f"param {node.id} is not a number or a string")
        return value
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Scalar = True
            for v in node.values:
                result = _eval(v, env)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = _eval(v, env)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _eval(node.operand, env)
        if isinstance(value, str) and not isinstance(node.op, ast.Not):
            raise TypeError("bad operand for a unary operator")
        return _UNARY[type(node.op)](value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _arith(node.op, _eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Compare):
        left: Scalar | tuple[Scalar, ...] = _eval(node.left, env)
        for op, right_node in zip(node.ops, node.comparators):
            if type(op) not in _CMPOPS:
                raise TypeError("comparison outside the grammar")
            if isinstance(right_node, (ast.Tuple, ast.List)):
                if not isinstance(op, (ast.In, ast.NotIn)):
                    raise TypeError("a list outside `in`")
                right: Scalar | tuple[Scalar, ...] = tuple(_eval(e, env) for e in right_node.elts)
            else:
                right = _eval(right_node, env)
                if isinstance(op, (ast.In, ast.NotIn)) and not (
                    isinstance(left, str) and isinstance(right, str)
                ):
                    raise TypeError("`in` needs a literal list or two strings")
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    raise TypeError(f"{type(node).__name__} is outside the `kope: require` grammar")
