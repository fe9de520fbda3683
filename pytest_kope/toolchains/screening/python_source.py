"""Python (Triton) sources: imports from an allow-list of modules, and no way to the interpreter's
internals (dunders, stdlib modules reached through attributes, frames, string-keyed access) or to patch
anything (attribute assignment)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Mapping
from typing import Any

# -- Python (Triton) sources ---------------------------------------------------------------------------

# Modules a kernel source may import (and their submodules, unless a name on the way is refused below).
ALLOWED_MODULES = frozenset({"triton", "torch", "torch_npu", "math", "numpy", "__future__"})
# Builtins no kernel needs and an escape would: files, code, attribute access by string, namespaces.
FORBIDDEN_BUILTINS = frozenset(
    {
        "open", "eval", "exec", "compile", "__import__", "getattr", "setattr", "delattr", "globals",
        "locals", "vars", "breakpoint", "input", "exit", "quit", "memoryview", "help",
    }
)  # fmt: skip
# Attribute names that reach the interpreter, the test oracle, native code or files through any object:
# frames and code objects, module tables, the testing helpers an oracle uses, ctypes views, pickling.
FORBIDDEN_ATTR_NAMES = frozenset(
    {
        "testing", "modules", "builtins", "ctypes", "ctypeslib", "cpp_extension", "load_library", "hub",
        "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
        "ag_await", "tb_frame", "tb_next", "f_globals", "f_locals", "f_builtins", "f_back", "f_code",
        "co_code", "co_consts", "co_names", "func_globals", "tofile", "dump",
    }
)  # fmt: skip
# Stdlib module names that are also the names of the libraries' own functions or modules
# (np.array, x.copy(), torch.trace, tl.math, np.random): allowed as attributes.
_STDLIB_NAMES_ALLOWED = frozenset({"math", "random", "array", "copy", "select", "trace", "chunk"})
STDLIB_ATTR_NAMES = frozenset(sys.stdlib_module_names) - _STDLIB_NAMES_ALLOWED
# Dotted names that reach files, processes, native code or process-wide settings through an allowed module.
FORBIDDEN_ATTRS = (
    "torch.load", "torch.save", "torch.hub", "torch.utils.cpp_extension", "torch.ops.load_library",
    "torch.classes.load_library", "torch.cuda.memory", "torch.distributed", "torch.multiprocessing",
    "torch.serialization", "torch.package", "torch.library", "torch.jit.load", "torch.jit.save",
    "torch.set_flush_denormal", "torch.set_num_threads", "torch.set_default_dtype",
    "torch.set_default_device", "numpy.load", "numpy.save", "numpy.savez", "numpy.savez_compressed",
    "numpy.savetxt", "numpy.loadtxt", "numpy.genfromtxt", "numpy.fromfile", "numpy.memmap",
    "numpy.DataSource", "numpy.ctypeslib", "numpy.lib.format", "numpy.lib.npyio", "numpy.f2py",
    "numpy.distutils", "triton.runtime.build", "triton.tools",
)  # fmt: skip
_WHERE = " is not allowed in a kernel source"


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _attr_problem(attr: str) -> str | None:
    """Why an attribute name (or a module path component) is refused, or None."""
    if _is_dunder(attr):
        return f"dunder attribute .{attr}{_WHERE}"
    if attr.startswith("_"):
        return f"private attribute .{attr}{_WHERE} (it reaches a library's internals)"
    if attr in STDLIB_ATTR_NAMES:
        return f"attribute .{attr}{_WHERE} (it names the standard-library module {attr})"
    if attr in FORBIDDEN_ATTR_NAMES:
        return f"attribute .{attr}{_WHERE} (it reaches the interpreter, the oracle, native code or files)"
    return None


def _dotted_problem(dotted: str) -> str | None:
    if any(dotted == f or dotted.startswith(f + ".") for f in FORBIDDEN_ATTRS):
        return f"{dotted}{_WHERE}"
    return None


def screen_python_source(text: str, filename: str = "<source>") -> list[str]:
    """Reasons to refuse a Python kernel source before running it, `file:line: why` each; [] if clean.

    A first filter, not a sandbox: the judge's child process is the containment.
    """
    try:
        tree = ast.parse(text, filename)
    except SyntaxError:
        return []  # the build reports it, with the line
    except ValueError as e:  # e.g. a NUL byte
        return [f"{filename}: unreadable source ({e})"]
    screen = _Screen(filename, _module_aliases(tree))
    for node in ast.walk(tree):
        check = _CHECKS.get(type(node))
        if check is not None:
            check(screen, node)
    return list(dict.fromkeys(screen.reasons))


class _Screen:
    """One source's screen: a check per node type, each adding `file:line: why` reasons."""

    def __init__(self, filename: str, aliases: dict[str, str]):
        self.filename, self.aliases = filename, aliases
        self.reasons: list[str] = []
        self.reported: set[int] = set()  # names already refused as the callee of a call

    def refuse(self, node: ast.AST, why: str) -> None:
        self.reasons.append(f"{self.filename}:{getattr(node, 'lineno', '?')}: {why}")

    def import_(self, node: ast.Import) -> None:
        for a in node.names:
            top, *rest = a.name.split(".")
            if top not in ALLOWED_MODULES:
                self.refuse(node, f"import of {a.name}{_WHERE}")
                continue
            why = next(filter(None, map(_attr_problem, rest)), None) or _dotted_problem(a.name)
            if why:
                self.refuse(node, f"import of {a.name}{_WHERE} ({why})")
            if a.asname and _is_dunder(a.asname):
                self.refuse(node, f"import as {a.asname}{_WHERE}")

    def import_from(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        top, *rest = mod.split(".")
        if node.level or top not in ALLOWED_MODULES:
            self.refuse(node, f"import from {'.' * node.level}{mod}{_WHERE}")
            return
        if any(a.name == "*" for a in node.names):
            self.refuse(node, f"star import from {mod}{_WHERE} (import the names it uses)")
        for a in node.names:
            if a.name == "*" or mod == "__future__":
                continue
            why = (
                next(filter(None, map(_attr_problem, [*rest, a.name])), None)
                or _dotted_problem(f"{mod}.{a.name}")
                or (f"import as {a.asname}{_WHERE}" if a.asname and _is_dunder(a.asname) else None)
            )
            if why:
                self.refuse(node, f"import of {a.name} from {mod}{_WHERE} ({why})")

    def call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_BUILTINS:
            self.refuse(node, f"call to {node.func.id}(){_WHERE}")
            self.reported.add(id(node.func))

    def name(self, node: ast.Name) -> None:
        if id(node) not in self.reported and (node.id in FORBIDDEN_BUILTINS or _is_dunder(node.id)):
            self.refuse(node, f"use of {node.id}{_WHERE}")

    def attribute(self, node: ast.Attribute) -> None:
        why = _attr_problem(node.attr) or _dotted_problem(_dotted(node, self.aliases) or "")
        if why:
            self.refuse(node, why)
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.refuse(
                node,
                f"assignment to attribute .{node.attr}{_WHERE} "
                "(a kernel sets no attributes: it could patch torch, numpy or the oracle)",
            )

    def subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            root = _root(node)
            if isinstance(root, ast.Name) and root.id in self.aliases:
                self.refuse(node, f"assignment into {root.id} (an imported module){_WHERE}")

    def scope(self, node: ast.Global | ast.Nonlocal) -> None:
        for name in node.names:
            if name in self.aliases:
                self.refuse(node, f"{type(node).__name__.lower()} {name} (an imported module){_WHERE}")

    def match_class(self, node: ast.MatchClass) -> None:  # `case object(sys=s)` reads attributes by name
        for attr in node.kwd_attrs:
            why = _attr_problem(attr)
            if why:
                self.refuse(node, why)


_CHECKS: dict[type[ast.AST], Callable[[_Screen, Any], None]] = {
    ast.Import: _Screen.import_,
    ast.ImportFrom: _Screen.import_from,
    ast.Call: _Screen.call,
    ast.Name: _Screen.name,
    ast.Attribute: _Screen.attribute,
    ast.Subscript: _Screen.subscript,
    ast.Global: _Screen.scope,
    ast.Nonlocal: _Screen.scope,
    ast.MatchClass: _Screen.match_class,
}


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to imported modules or names from them: alias -> dotted origin."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for a in node.names:
                if a.name != "*":
                    aliases[a.asname or a.name] = f"{node.module or ''}.{a.name}"
    return aliases


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _dotted(node: ast.expr, aliases: Mapping[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))
