"""The shape of the package: lower floors never import higher ones, so no import circle exists.

Every import counts, lazy ones inside functions included (a lazy import only hides a circle), and imports
under `if TYPE_CHECKING:` too: they never run, but a circle of types is still a circle of ideas, two
modules that cannot be read or changed apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_kope"


def _module(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(package: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, its dots resolved against `package`."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    return ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))


class _Imports(ast.NodeVisitor):
    """The package's modules one module imports (`package` is the module's own package)."""

    def __init__(self, package: str, modules: set[str], typing: bool):
        self.package, self.modules, self.typing = package, modules, typing
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if self.typing or "TYPE_CHECKING" not in ast.unparse(node.test):
            self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        target = _target(self.package, node)
        for alias in node.names:
            full = f"{target}.{alias.name}"
            self.found.add(full if full in self.modules else target)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(alias.name for alias in node.names)


def import_graph(typing: bool = True, root: Path = PACKAGE) -> dict[str, set[str]]:
    """Which of the package's modules each module imports (`typing`: `if TYPE_CHECKING:` ones too)."""
    modules = {_module(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        visitor = _Imports(package, set(modules), typing)
        visitor.visit(ast.parse(path.read_text()))
        graph[name] = {m for m in visitor.found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles(import_graph(typing=False)) == []


def test_no_import_cycle_through_typing_only_imports():
    assert cycles(import_graph(typing=True)) == []


def test_the_graph_sees_a_circle_made_only_of_typing_imports(tmp_path: Path):
    """Without this, a graph that skipped `if TYPE_CHECKING:` blocks would pass the test above."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n")
    assert cycles(import_graph(typing=True, root=pkg)) == [["pkg.a", "pkg.b"]]
    assert cycles(import_graph(typing=False, root=pkg)) == []


def test_the_cycle_finder_finds_one():
    """Without this, a finder that never reports anything would pass the test above."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_judges_child_side_never_imports_the_plugin_or_the_session():
    graph = import_graph()
    for child_side in (
        "pytest_kope.judge.child.plugin",
        "pytest_kope.judge.child.building",
        "pytest_kope.judge.controller.runner",
    ):
        assert not graph[child_side] & {
            "pytest_kope.plugin",
            "pytest_kope.session.session",
            "pytest_kope.session.loop",
        }, child_side


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def sizes(root: Path = PACKAGE) -> tuple[dict[str, int], dict[str, int]]:
    """Lines per module, and lines per function (decorators excluded, nested functions counted in their
    parent and on their own), for every module under `root`."""
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        name = _module(path) if root == PACKAGE else path.stem
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                functions[f"{name}:{node.lineno}:{node.name}"] = node.end_lineno - node.lineno + 1
    return modules, functions


def test_no_module_over_400_lines_and_no_function_over_60():
    modules, functions = sizes()
    assert {m: n for m, n in modules.items() if n > MAX_MODULE_LINES} == {}
    assert {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES} == {}


def test_the_size_check_sees_a_long_function(tmp_path: Path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n\n\ndef g():\n    return 1\n")
    modules, functions = sizes(tmp_path)
    assert modules == {"long": MAX_FUNCTION_LINES + 5}
    assert functions == {"long:1:f": MAX_FUNCTION_LINES + 1, f"long:{MAX_FUNCTION_LINES + 4}:g": 2}


MAX_PARAMETERS = 7


def long_signatures(root: Path = PACKAGE) -> dict[str, int]:
    """Functions taking more than MAX_PARAMETERS parameters (self and cls not counted): values that travel
    together belong in one typed object. Dataclass constructors are generated, so never seen here."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        name = _module(path, root)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
                count = len([n for n in names if n not in ("self", "cls")])
                if count > MAX_PARAMETERS:
                    found[f"{name}:{node.lineno}:{node.name}"] = count
    return found


def test_no_function_takes_more_than_7_parameters():
    assert long_signatures() == {}


def _package(folder: Path, module: str) -> Path:
    """A package of one module, `m.py`, for a check to look at."""
    folder.mkdir()
    (folder / "m.py").write_text(module)
    return folder


def test_the_signature_check_sees_a_long_one(tmp_path: Path):
    module = "class A:\n    def ok(self, a, b, c, d, e, f, g):\n        pass\n\n"
    module += "def long(a, b, c, d, e, f, g, *rest):\n    pass\n"
    assert long_signatures(_package(tmp_path / "pkg", module)) == {"pkg.m:5:long": 8}


def test_mypy_checks_every_test_module_as_a_test():
    """pyproject's mypy override for the tests (signatures unannotated, bodies checked) names each module
    in tests/, since mypy takes no pattern like test_*: a test module left out would be held to the
    package's --strict signatures, a listed one that is gone is a stale entry."""
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    (block,) = [b for b in text.split("[[tool.mypy.overrides]]")[1:] if "disallow_untyped_defs = false" in b]
    listed = set(re.findall(r'"([\w.]+)"', block.partition("module = [")[2].partition("]")[0]))
    present = {p.stem for p in (PACKAGE.parent / "tests").glob("*.py")}
    assert (present - listed, listed - present) == (set(), set()), "(not listed, listed but gone)"


MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear"}
MUTATORS |= {"remove", "discard", "set", "put"}
STATEFUL = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "Queue", "Event"}


def _bound(node: ast.stmt) -> list[tuple[str, ast.expr]]:
    """The names a module-level statement binds, with the value each gets."""
    if isinstance(node, ast.Assign):
        return [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return [(node.target.id, node.value)]
    return []


def _changed(node: ast.AST) -> ast.expr | None:
    """What `node` changes in place: `x.append(...)`-like calls, `x[k] = ...`, `x.a = ...`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
        return node.func.value
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AugAssign)
        else []
    )
    return next((t.value for t in targets if isinstance(t, (ast.Subscript, ast.Attribute))), None)


def module_state(root: Path = PACKAGE / "judge") -> list[str]:
    """Module-level mutable state under `root`: a `global` statement, a module-level name bound to a
    new container or event (`STATEFUL`), or a function that changes a module-level name in place.
    Constant tables (names in capitals, never changed) and locks (a process's own resources) pass."""
    found: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(root.parent).as_posix()
        names = set()
        for node in tree.body:
            for name, value in _bound(node):
                names.add(name)
                called = ast.unparse(value.func).rpartition(".")[2] if isinstance(value, ast.Call) else ""
                table = name.isupper() or name == "__all__"
                if called in STATEFUL or (not table and isinstance(value, (ast.List, ast.Dict, ast.Set))):
                    found.append((where, node.lineno, name))
        for each in ast.walk(tree):
            if isinstance(each, ast.Global):
                found.append((where, each.lineno, f"global {', '.join(each.names)}"))
            changed = _changed(each)
            if isinstance(changed, ast.Name) and changed.id in names:
                found.append((where, getattr(each, "lineno", 0), f"{changed.id} changed"))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def test_no_module_level_mutable_state_in_the_judge():
    """The judge's state lives in objects a run or a child owns (issue 54): two runs in one process, or
    a test beside a run, never share a registry, a switch or a cache of results by accident."""
    assert module_state() == []


def test_the_state_check_sees_each_kind(tmp_path: Path):
    module = "import threading\nTABLE = {1: 2}\n_live = {}\nSTOP = threading.Event()\nSEEN = []\n"
    module += "def f(x):\n    global n\n    SEEN.append(x)\n    TABLE[x] = 1\n"
    assert module_state(_package(tmp_path / "judge", module)) == [
        "judge/m.py:3: _live", "judge/m.py:4: STOP", "judge/m.py:7: global n",
        "judge/m.py:8: SEEN changed", "judge/m.py:9: TABLE changed",
    ]  # fmt: skip


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reach(root: Path = PACKAGE) -> list[str]:
    """Private names (one leading underscore) a module takes from another module of the package:
    imported by name, or read off a module it imported."""
    modules = {_module(p, root) for p in root.rglob("*.py")}
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        name = _module(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        where = path.relative_to(root.parent).as_posix()
        tree = ast.parse(path.read_text())
        held: set[str] = set()  # local names bound to the package's modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _target(package, node)
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        held.add(alias.asname or alias.name)
                    elif _private(alias.name) and target in modules and target != name:
                        found.append(f"{where}:{node.lineno}: {alias.name} from {target}")
            elif isinstance(node, ast.Import):
                held.update(a.asname for a in node.names if a.asname and a.name in modules)
        for read in [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)]:
            owner = read.value.id if isinstance(read.value, ast.Name) else ""
            if owner in held and _private(read.attr):
                found.append(f"{where}:{read.lineno}: {owner}.{read.attr}")
    return found


def test_private_names_stay_in_their_module():
    """A split that makes two modules share private names defeats the split (issue 54): merge them,
    or draw the line again and make the shared name public."""
    assert private_reach() == []


def test_the_private_name_check_sees_both_ways(tmp_path: Path):
    pkg = _package(tmp_path / "p", "def _helper():\n    return 1\n")
    (pkg / "n.py").write_text("from . import m\nfrom .m import _helper\n\nx = m._helper() + _helper()\n")
    assert private_reach(pkg) == ["p/n.py:2: _helper from p.m", "p/n.py:4: m._helper"]
