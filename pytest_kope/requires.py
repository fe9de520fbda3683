"""The `kope: require` grammar: a condition over the params, checked by a fixed grammar and evaluated
on a point by walking its tree, never run (`eval` and `compile` never see it)."""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

Scalar = int | float | str  # a param value, and what a condition computes (`spec.Scalar` is this one)

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
