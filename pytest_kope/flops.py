"""How many FLOPs one kernel call does, as the operator's marker declares it: `flops="2*M*N*K"`.

The count is an arithmetic expression over the kernel's integer argument names (as its `kope: kernel`
prototype spells them) and integer literals, with ``+ - * / // ( )`` only. It is read by a fixed
grammar (parsed, checked node by node and interpreted here, never run as Python) and evaluated per
timed call on that call's integer arguments, so the judge can hold the time against the FMA peak.

    pytest.mark.kope("sgemm", source="sgemm.c", flops="2*M*N*K")          # every function
    pytest.mark.kope("attn", source="attn.c", flops={"qk": "2*S*S*D"})    # per function; others: none

Declare a count every correct kernel must do (a lower bound: the conventional count, not what one
implementation happens to do); a count above that makes honest kernels look impossibly fast.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from typing import Any

from .errors import MarkerError

ALL = "*"  # the key under which `flops="..."` applies to every function of the kernel
MAX_CHARS = 200  # and no `**`: a count's integers stay small (no `9**9**9` to compute)
_GRAMMAR = "flops= takes an arithmetic expression over the kernel's integer arguments: names, integers, + - * / // ( )"
_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
}  # fmt: skip
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class FlopsError(MarkerError):
    """A marker's `flops=` is outside the grammar, or names what the timed call does not pass."""


def parse_flops(given: object, where: str) -> dict[str, str]:
    """The marker's `flops=` as {function (or ALL): expression}, each checked against the grammar;
    {} when not given. `where` (the test's id) starts every error message."""
    if given is None:
        return {}
    if isinstance(given, str):
        exprs = {ALL: given}
    elif isinstance(given, Mapping) and given and all(isinstance(k, str) for k in given):
        exprs = dict(given)
    else:
        raise FlopsError(
            f'{where}: pytest.mark.kope(flops=...) takes an expression such as "2*M*N*K", or a dict'
            f' {{"<function>": "<expression>"}}, got {given!r}'
        )
    for name, expr in exprs.items():
        if not isinstance(expr, str):
            raise FlopsError(f"{where}: pytest.mark.kope(flops=...): the count for {name!r} must be a string")
        why = flops_error(expr)
        if why:
            raise FlopsError(f"{where}: pytest.mark.kope(flops={expr!r}): {why}; fix the marker")
    return exprs


def flops_error(expr: str) -> str:
    """Why `expr` is not in the grammar (one line), or "" when it is."""
    if len(expr) > MAX_CHARS:
        return f"{_GRAMMAR}; found an expression longer than {MAX_CHARS} characters"
    try:
        _parsed(expr)
    except _Refused as e:
        return f"{_GRAMMAR}; found {e}"
    except RecursionError:
        return f"{_GRAMMAR}; found an expression nested too deeply"
    return ""


def names_in(expr: str) -> set[str]:
    """The argument names a checked expression reads."""
    return {n.id for n in ast.walk(_parsed(expr)) if isinstance(n, ast.Name)}


def count_flops(exprs: Mapping[str, str], function: str, scalars: Mapping[str, object], where: str) -> float:
    """The FLOPs of one call of `function` with these integer arguments; 0.0 when none is declared for
    it. Raises FlopsError naming the test when the expression reads a name the call does not pass."""
    expr = exprs.get(function, exprs.get(ALL))
    if expr is None:
        return 0.0
    ints = {k: int(v) for k, v in scalars.items() if _integer(v)}  # type: ignore[call-overload]
    missing = sorted(names_in(expr) - set(ints))
    if missing:
        have = ", ".join(sorted(ints)) or "none"
        raise FlopsError(
            f"{where}: pytest.mark.kope(flops={expr!r}) reads {', '.join(missing)}, which {function}() does"
            f" not take as an integer argument (its integer arguments: {have}); fix the marker"
        )
    try:
        return float(_eval(_parsed(expr).body, ints))
    except (ZeroDivisionError, OverflowError) as e:
        raise FlopsError(f"{where}: pytest.mark.kope(flops={expr!r}) cannot be evaluated: {e}") from None


def _integer(v: object) -> bool:
    """An int or a numpy integer (never a bool, a float or an array)."""
    return not isinstance(v, bool) and hasattr(v, "__index__") and getattr(v, "ndim", 0) == 0


class _Refused(Exception):
    """An expression outside the grammar; the message says what was found."""


@functools.lru_cache(maxsize=64)
def _parsed(expr: str) -> ast.Expression:
    try:
        tree = ast.parse(expr.strip(), mode="eval")  # parsed, never compiled or run
    except SyntaxError as e:
        raise _Refused(f"a syntax error ({e.msg}) in {expr.strip()!r}") from None
    except ValueError as e:  # e.g. a NUL byte
        raise _Refused(f"unreadable text ({e})") from None
    _check(tree.body)
    return tree


def _check(node: ast.expr) -> None:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise _Refused(f"the constant {node.value!r} (integers only)")
    elif isinstance(node, ast.Name):
        if node.id.startswith("__"):
            raise _Refused(f"the name {node.id}")
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        _check(node.operand)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        _check(node.left)
        _check(node.right)
    else:
        raise _Refused(f"{ast.unparse(node)[:60]!r}, which is not a name, an integer or one of + - * / //")


def _eval(node: ast.expr, env: Mapping[str, int]) -> int | float:
    """Interpret a checked expression (anything else raises, so it stays safe unchecked)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and not node.id.startswith("__"):
        return env[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, env))  # type: ignore[no-any-return]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))  # type: ignore[no-any-return]
    raise TypeError(f"{type(node).__name__} is outside the flops grammar")
