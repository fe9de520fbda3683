"""Python kernel sources (Triton launchers): the kernel declaration, tuning params, screening, loading.

Shared by the `triton` and `triton-ascend` toolchains. A source is an ordinary Python module holding
``@triton.jit`` kernels and, for each declared kernel, a plain Python *launcher* that takes tensors
and scalars, picks the grid and launches::

    # kope: kernel softmax(x: in, y: out, rows, cols)
    # kope: param BLOCK = 1024 | 512 | 2048
    # kope: param num_warps = 4 | 8
    BLOCK = 1024
    num_warps = 4

    @triton.jit
    def _softmax_kernel(...): ...

    def softmax(x, y, rows, cols):
        _softmax_kernel[(rows,)](x, y, cols, BLOCK=BLOCK, num_warps=num_warps)

Kernel declaration: ``kope: kernel NAME(ARG, ...)`` where NAME is the launcher's name and each ARG is
``name: in`` (read only; the oracle checks it is unchanged), ``name: out`` (must be fully written; the
oracle poisons it with NaN first), ``name: inout`` (read and written), or a bare ``name`` (a scalar).
``name: int``/``name: float`` (any other word) also declares a scalar. ``kope: inplace y`` makes ``y``
inout too.

Params: each ``kope: param NAME = a | b`` needs a top-level ``NAME = <literal>`` assignment in the
module. The build replaces that literal with the candidate's value, so the file stays an ordinary,
importable module that runs its committed values without pytest-kope; `bake` moves a winner into
both the header and the assignment.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import BuildError, SpecError
from ..spec import FLAGS, KernelSpec, Scalar, bake_defaults
from .base import IN, INOUT, OUT, SCALAR, Arg
from .screening import (
    ALLOWED_MODULES,
    FORBIDDEN_ATTRS,  # noqa: F401 - re-exported
    FORBIDDEN_BUILTINS,
    screen_python_source,
)

ALLOWED_IMPORTS = ALLOWED_MODULES  # the old names, kept for imports
FORBIDDEN_CALLS = FORBIDDEN_BUILTINS

_DECL = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*\((?P<args>.*)\)\s*$")
_ROLES = {"in": IN, "out": OUT, "inout": INOUT}


def parse_kernel(
    decl: str, inplace: frozenset[str] = frozenset(), where: str = "<source>"
) -> tuple[str, tuple[Arg, ...]]:
    """``softmax(x: in, y: out, rows, cols)`` -> ("softmax", (Arg("x", "in"), ...))."""
    m = _DECL.match(decl)
    if not m:
        raise SpecError(f"{where}: write `kope: kernel NAME(x: in, y: out, n)`, got {decl!r}")
    args: list[Arg] = []
    for part in filter(None, (p.strip() for p in m.group("args").split(","))):
        name, _, kind = (s.strip() for s in part.partition(":"))
        if not name.isidentifier():
            raise SpecError(f"{where}: {name!r} in `kope: kernel {decl}` is not an argument name")
        role = _ROLES.get(kind, SCALAR)
        if name in inplace:
            role = INOUT
        args.append(Arg(name, role))
    names = [a.name for a in args]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: repeated argument name in `kope: kernel {decl}`")
    return m.group("name"), tuple(args)


def kernel_args(spec: KernelSpec, where: str) -> dict[str, tuple[Arg, ...]]:
    """Every declared kernel of a spec, by launcher name."""
    if not spec.kernels:
        raise BuildError(where, "no `# kope: kernel NAME(x: in, y: out, n)` line declares a launcher")
    return dict(parse_kernel(d, spec.inplace, where) for d in spec.kernels)


def _assignments(tree: ast.Module) -> dict[str, ast.expr]:
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.setdefault(node.target.id, node.value)
    return found


def _is_literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def apply_params(text: str, params: Mapping[str, Scalar], filename: str) -> str:
    """`text` with each param's top-level ``NAME = literal`` set to ``params[NAME]``."""
    if FLAGS in params:
        raise BuildError(
            filename,
            "Triton sources take no compiler flags: remove `kope: flags`; "
            "tune launch options as params instead (`kope: param num_warps = 4 | 8`)",
        )
    if not params:
        return text
    try:
        tree = ast.parse(text, filename)
    except SyntaxError as e:
        raise BuildError(filename, f"{filename}:{e.lineno}: {e.msg}") from None
    found = _assignments(tree)
    starts = [0, *itertools.accumulate(len(line) for line in text.splitlines(keepends=True))]
    edits = []
    for name, value in params.items():
        node = found.get(name)
        if node is None or not _is_literal(node):
            raise BuildError(
                filename,
                f"`kope: param {name}` needs a top-level `{name} = <literal>` line "
                f"for the build to set (e.g. `{name} = {value!r}`); none in {filename}",
            )
        assert node.end_lineno is not None and node.end_col_offset is not None
        edits.append(
            (
                _offset(text, starts, node.lineno, node.col_offset),
                _offset(text, starts, node.end_lineno, node.end_col_offset),
                repr(value),
            )
        )
    for begin, end, new in sorted(edits, reverse=True):
        text = text[:begin] + new + text[end:]
    return text


def _offset(text: str, starts: list[int], lineno: int, col: int) -> int:
    line_start = starts[lineno - 1]
    line = text[line_start : starts[lineno]] if lineno < len(starts) else text[line_start:]
    return line_start + len(line.encode()[:col].decode(errors="ignore"))  # ast columns count UTF-8 bytes


def bake(text: str, point: Mapping[str, Scalar], filename: str = "<source>") -> str:
    """The source with `point` as both the declared default and the assigned value (what to commit)."""
    return apply_params(bake_defaults(text, point), {k: v for k, v in point.items() if k != FLAGS}, filename)


SCREEN_ENV = "KOPE_PY_SCREEN"  # "0" switches the source screen off (tests of the boundary behind it)


def screen(text: str, filename: str = "<source>") -> list[str]:
    """Reasons to refuse a Python kernel source before running it; empty when it looks clean.

    A first filter, not a sandbox: the kernel server's jail and filter are the containment, and no
    decision runs where the candidate does. The rules live in `screening` (one implementation for
    every toolchain and the claude agent).
    """
    if os.environ.get(SCREEN_ENV) == "0":
        return []
    return screen_python_source(text, filename)


_loaded = itertools.count()


def load_module(path: Path, where: str) -> ModuleType:
    """Import `path` as a fresh module (a new name every time) and return it; BuildError on failure."""
    name = f"kope_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{next(_loaded)}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise BuildError(where, _format_exc(e, path)) from e
    return module


def _format_exc(e: BaseException, path: Path) -> str:
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
    at = f"{path.name}:{frames[-1].lineno}: " if frames else ""
    return f"{at}{type(e).__name__}: {e}"


def launchers(module: ModuleType, args: Mapping[str, tuple[Arg, ...]], where: str) -> dict[str, Any]:
    """The declared launchers of a loaded module, checked to be plain callables."""
    found = {}
    for name in args:
        fn = getattr(module, name, None)
        if fn is None:
            raise BuildError(where, f"`kope: kernel {name}(...)` is declared but {where} defines no {name}")
        if (
            not callable(fn)
            or hasattr(fn, "arg_names")
            or type(fn).__name__ in ("JITFunction", "InterpretedFunction")
        ):
            raise BuildError(
                where,
                f"{name} must be a plain Python launcher that picks the grid and "
                f"launches the @triton.jit kernel, not the kernel itself",
            )
        found[name] = fn
    return found
