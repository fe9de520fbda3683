"""An operator as its tests declare it: `pytest.mark.kope(name, source=..., family=..., toolchain=...)`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .candidate import Candidate
from .errors import MarkerError
from .flops import parse_flops
from .spec import FLAGS, KernelSpec, SourceFlags, TuningSpace, parse_spec
from .toolchains import toolchain_for
from .toolchains.flagblock import searchable
from .toolchains.repocc import identify, repo_compiler

if TYPE_CHECKING:
    from .agents.base import OperatorInfo

MARKER = "kope"
# build files that mean the repo compiles its kernels itself, with flags a merge of a kope branch
# cannot change (only what the committed tree holds reaches that build)
BUILD_FILES = ("Makefile", "makefile", "GNUmakefile", "CMakeLists.txt", "meson.build", "setup.py")
_OURS = re.compile(r"-?kope-(?:[0-9a-f]{8}|seed\d+|candidate)\b")


@dataclass(frozen=True)
class Operator:
    """One kernel to optimize: its name, source file(s), toolchain and family."""

    name: str
    source: Path  # absolute path of the committed kernel source
    toolchain: str
    family: str
    rtol: float | None = None  # norm-wise tolerance of candidate against committed kernel (marker `rtol=`)
    includes: tuple[Path, ...] = ()  # read-only include directories inside the repo (marker `include=`)
    companions: tuple[Path, ...] = ()  # the operator's other sources, built with the candidate's
    build: tuple[str, Path, str] | None = None  # the repo's own build: (command, root, library)
    flops: tuple[tuple[str, str], ...] = ()  # FLOPs per call by function, "*" for all (marker `flops=`)

    @property
    def text(self) -> str:
        return _read(self.source)

    @property
    def spec(self) -> KernelSpec:
        return parse_spec(self.text, str(self.source))

    def build_context(self, spec: KernelSpec) -> KernelSpec:
        """`spec` with this operator's include directories and companion sources."""
        from dataclasses import replace

        return replace(
            spec,
            source_flags=self.source_flags,
            include_dirs=tuple(str(p) for p in (self.source.parent, *self.includes)),
            companions=tuple(str(p) for p in self.companions),
            build=(
                (
                    self.build[0],
                    str(self.build[1]),
                    str(self.source.relative_to(self.build[1])),
                    self.build[2],
                )
                if self.build
                else None
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": str(self.source),
            "toolchain": self.toolchain,
            "family": self.family,
            "rtol": self.rtol,
            "includes": [str(p) for p in self.includes],
            "companions": [str(p) for p in self.companions],
            "build": [self.build[0], str(self.build[1]), self.build[2]] if self.build else None,
            "flops": dict(self.flops),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Operator:
        return cls(
            data["name"],
            Path(data["source"]),
            data["toolchain"],
            data["family"],
            data.get("rtol"),
            tuple(Path(p) for p in data.get("includes", ())),
            tuple(Path(p) for p in data.get("companions", ())),
            (data["build"][0], Path(data["build"][1]), data["build"][2]) if data.get("build") else None,
            tuple(dict(data.get("flops") or {}).items()),
        )

    @property
    def own_build(self) -> str:
        """What else builds this kernel, in a few words ("" when only pytest-kope does): the marker's
        `build=`, or a build file in the source's folder or above it, up to the repository's root."""
        if self.build:
            return f"its marker's build={self.build[0]!r}"
        folder = self.source.parent
        for _ in range(4):
            found = next((folder / n for n in BUILD_FILES if (folder / n).is_file()), None)
            if found is not None:
                return f"its own {found.name} ({found})"
            if (folder / ".git").exists() or folder.parent == folder:
                break
            folder = folder.parent
        return ""

    @property
    def source_flags(self) -> SourceFlags | None:
        """Where the repo builds the kernel itself and its header declares `flags`: the first value
        (what the build passes) and the compiler the build runs, which reads every other value from
        the source (`toolchains/flagblock.py`); None where pytest-kope's own build passes them."""
        axes = self.spec.space.axes
        if self.toolchain != "c" or FLAGS not in axes or not self.own_build:
            return None
        command, root = (self.build[0], self.build[1]) if self.build else ("", self.source.parent)
        found = repo_compiler(command, root, self.source)
        return SourceFlags(str(axes[FLAGS][0]), (found.command, found.read_from))

    def flags_unsearched(self) -> tuple[str, list[str]]:
        """The repo's compiler in a few words, and each declared `flags` value with no source form
        on it (one phrase each, naming the flag and why); ("", []) where flags go on the command line."""
        own = self.source_flags
        if own is None:
            return "", []
        compiler = identify(*own.compiler)
        return compiler.name(), searchable([str(v) for v in self.spec.space.axes[FLAGS]], own.held, compiler)[
            1
        ]

    @property
    def searched_space(self) -> TuningSpace:
        """The space the search may walk: the declared one, less the `flags` values that have no
        source form on the repo's compiler when the repo builds the kernel itself. A merge carries
        the source, never a Makefile's flags: a value reaches that build only written into the file
        (`toolchains/flagblock.py`), as the judge builds it."""
        space = self.spec.space
        if not self.own_build or FLAGS not in space.axes:
            return space
        own = self.source_flags
        if own is None:  # not a C kernel: no source forms, the build's own flags only
            return TuningSpace({**space.axes, FLAGS: space.axes[FLAGS][:1]}, space.requires)
        kept, _ = searchable([str(v) for v in space.axes[FLAGS]], own.held, identify(*own.compiler))
        return TuningSpace({**space.axes, FLAGS: tuple(kept)}, space.requires)

    def baseline(self) -> Candidate:
        """The committed kernel, built at its declared defaults."""
        return Candidate(
            source=self.text,
            filename=self.source.name,
            toolchain=self.toolchain,
            params=self.spec.space.defaults,
            idea="committed kernel",
            agent="baseline",
        )

    def info(
        self, tests: dict[str, str], screen: Callable[[Candidate], list[str]] | None = None
    ) -> OperatorInfo:
        """What an agent may know of this operator: its kernel, space, contract and test sources."""
        from .agents.base import OperatorInfo

        return OperatorInfo(
            self.name,
            self.family,
            self.toolchain,
            self.source.name,
            self.text,
            self.searched_space,
            self.spec.kernels,
            tests,
            screen=screen,
        )


def interface_change(committed: KernelSpec, candidate: KernelSpec) -> str:
    """How a candidate's declared interface differs from the committed one ("" when it does not).

    The committed `kernel` and `inplace` lines are the oracle's: they say which arguments the guards
    treat as read-only, so a candidate may not redeclare them (it keeps its own tuning space).
    """
    norm = [" ".join(k.replace("*", " * ").replace(",", " , ").split()) for k in committed.kernels]
    theirs = [" ".join(k.replace("*", " * ").replace(",", " , ").split()) for k in candidate.kernels]
    if theirs != norm:
        return f"declares kernels {candidate.kernels} but the committed source declares {committed.kernels}"
    if candidate.inplace != committed.inplace:
        mine = ", ".join(sorted(committed.inplace)) or "none"
        return f"declares in-place arguments {', '.join(sorted(candidate.inplace)) or 'none'} (committed: {mine})"
    return ""


def _read(path: Path) -> str:
    return path.read_text()


def operator_of(item: pytest.Item) -> Operator | None:
    """The operator an item judges, from the nearest `kope` marker; None for ordinary tests."""
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None
    if not mark.args or not isinstance(mark.args[0], str):
        raise MarkerError(
            f"{item.nodeid}: pytest.mark.kope needs the operator name first, e.g. "
            'pytest.mark.kope("softmax", source="softmax.c")'
        )
    name = mark.args[0]
    where = Path(str(item.path)).parent
    given = mark.kwargs.get("source") or (mark.args[1] if len(mark.args) > 1 else None)
    if not given:
        raise MarkerError(f'{item.nodeid}: pytest.mark.kope("{name}") needs source="<kernel file>"')
    files = [(where / s).resolve() for s in ([given] if isinstance(given, (str, Path)) else given)]
    for path in files:
        if not path.is_file():
            raise MarkerError(
                f"{item.nodeid}: kernel source {path} of operator {name!r} does not exist; fix source= in the marker"
            )
    path = files[0]  # the file candidates rewrite; the others are built with it, unchanged
    toolchain = mark.kwargs.get("toolchain") or toolchain_for(item.config, path)
    if toolchain is None:
        raise MarkerError(f"{item.nodeid}: cannot tell the toolchain of {path.name}; pass toolchain=...")
    rtol = mark.kwargs.get("rtol")
    if rtol is not None and not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise MarkerError(f"{item.nodeid}: pytest.mark.kope(rtol=...) takes a number in (0, 1), got {rtol!r}")
    includes = _include_dirs(item, where, mark.kwargs.get("include"))
    build = _own_build(item, where, path, mark.kwargs)
    family = mark.kwargs.get("family", name)
    flops = tuple(parse_flops(mark.kwargs.get("flops"), item.nodeid).items())
    return Operator(name, path, toolchain, family, rtol, includes, tuple(files[1:]), build, flops)


def _own_build(
    item: pytest.Item, where: Path, source: Path, kwargs: Mapping[str, Any]
) -> tuple[str, Path, str] | None:
    """`build="cmake ...", library="build/libop.so", root="."`: the repo builds the kernel itself."""
    command, library = kwargs.get("build"), kwargs.get("library")
    if command is None and library is None:
        return None
    if not (isinstance(command, str) and isinstance(library, str)):
        raise MarkerError(
            f'{item.nodeid}: pytest.mark.kope(build=...) needs both build="<shell command>" and '
            'library="<built shared library, relative to root>"'
        )
    root = (where / kwargs.get("root", ".")).resolve()
    if not source.is_relative_to(root):
        raise MarkerError(
            f"{item.nodeid}: the kernel source {source} is not under the build root {root}; fix root="
        )
    return command, root, library


def _include_dirs(item: pytest.Item, where: Path, given: Any) -> tuple[Path, ...]:
    """Include directories from the marker (relative to the test file) and the ini option `kope_include`
    (relative to the ini file's folder); each must exist."""
    config = item.config
    base = Path(str(config.inipath)).parent if config.inipath else Path(str(config.rootpath))
    marker = [(where / d).resolve() for d in ([given] if isinstance(given, (str, Path)) else given or [])]
    try:
        ini = [(base / d).resolve() for d in config.getini("kope_include")]
    except ValueError:  # the option is not registered (a child without the plugin's options)
        ini = []
    for d in (*marker, *ini):
        if not d.is_dir():
            raise MarkerError(
                f"{item.nodeid}: include directory {d} does not exist; fix include= in the marker or kope_include"
            )
    return tuple(dict.fromkeys((*marker, *ini)))


def same_operator(first: Operator, first_at: str, other: Operator, other_at: str) -> None:
    """Two markers that give one operator name must declare the same operator: a run judges and
    commits one kernel per name, so the second declaration would be dropped without a word."""
    if first == other:
        return
    mine, theirs = first.to_json(), other.to_json()
    field = next(k for k in mine if mine[k] != theirs[k])
    first_at, other_at = first_at.split("::")[0], other_at.split("::")[0]
    raise MarkerError(
        f"{other_at}: pytest.mark.kope({other.name!r}) gives {field}={theirs[field]!r}, but {first_at}"
        f" gives {field}={mine[field]!r} for the same operator; give each kernel its own name, or"
        " every module of one operator the same marker"
    )


def base_nodeid(nodeid: str) -> str:
    """A test's id without the candidate and seed parameters a judging child adds: the controller's id,
    and what the `rng` fixture derives its stream from, so one seed gives every kernel the same inputs."""
    stripped = _OURS.sub("", nodeid).replace("[-", "[")
    return stripped.replace("[]", "")


def is_performance_test(item: pytest.Item) -> bool:
    """Whether a test times its kernel (it uses the `kope_bench` fixture)."""
    return "kope_bench" in getattr(item, "fixturenames", ())
