"""Which compiler a repo's own build runs on a kernel: what the source-level forms of its flags
(`srcflags`) must be written for, since GCC and Clang honour different pragmas and attributes.

Read from the build, as make and CMake resolve it: a `CC=` on the build command (or CMake's
`-DCMAKE_C_COMPILER=`), then the build file (`CC = clang` in a Makefile, `set(CMAKE_C_COMPILER ...)`
in a CMakeLists.txt; a Makefile's `CC ?=` yields to `$CC`), then `$CC`, then `cc`. The kind comes
from that compiler's own `--version`, never from its name (`cc` is GCC on one machine, Clang on
another).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_MAKEFILES = ("GNUmakefile", "makefile", "Makefile")
_MAKE_CC = re.compile(r"^[ \t]*(?:override[ \t]+)?(CC|CXX)[ \t]*(\?=|:=|::=|\+=|=)[ \t]*(\S+)", re.M)
_CMAKE_CC = re.compile(r"set\s*\(\s*CMAKE_(C|CXX)_COMPILER\s+\"?([^\s\")]+)", re.I)


@dataclass(frozen=True)
class Compiler:
    """The compiler a build runs: its command, its kind ("gcc", "clang", "" when neither) and version."""

    command: str
    kind: str
    version: str  # the first line of its --version
    read_from: str  # where the build names it, for the run's line ("CC in Makefile", "$CC", ...)

    def name(self) -> str:
        """A few words for the run's output: `gcc 12.2.0 (CC in Makefile)`."""
        number = re.search(r"\d+\.\d+(?:\.\d+)?", self.version)
        return (
            f"{self.kind or self.command} {number.group(0) if number else ''}".strip()
            + f" ({self.read_from})"
        )


def repo_compiler(command: str, root: Path, source: Path) -> Compiler:
    """The compiler the repo's build uses on `source`: `command` is its `build=` (or "" when a build
    file beside or above the source is all there is), `root` the folder the search stops at."""
    cxx = source.suffix != ".c"
    env_cc = os.environ.get("CXX" if cxx else "CC", "")
    named, where = _from_command(command, cxx)
    if not named:
        named, where = _from_files(root, source, cxx, env_cc)
    if not named and env_cc:
        named, where = env_cc, "$CXX" if cxx else "$CC"
    if not named:
        named, where = ("c++" if cxx else "cc"), "the system's default"
    return identify(named, where)


def _from_command(command: str, cxx: bool) -> tuple[str, str]:
    """`make CC=clang`, `cmake -DCMAKE_C_COMPILER=clang`, `CC=clang make` on the build command."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    var, cmake = ("CXX", "CMAKE_CXX_COMPILER") if cxx else ("CC", "CMAKE_C_COMPILER")
    for word in words:
        for prefix in (f"{var}=", f"-D{cmake}=", f"-D{cmake}:FILEPATH=", f"-D{cmake}:STRING="):
            if word.startswith(prefix) and word[len(prefix) :]:
                return word[len(prefix) :], f"{var} on the build command"
    return "", ""


def _from_files(root: Path, source: Path, cxx: bool, env_cc: str) -> tuple[str, str]:
    """The first build file from the source's folder up to `root` (or a repository's top) that names one."""
    folder = source.parent
    for _ in range(8):
        for name in _MAKEFILES:
            path = folder / name
            if path.is_file():
                for var, op, value in _MAKE_CC.findall(path.read_text(errors="replace")):
                    if (var == "CXX") == cxx and "$" not in value:
                        if op == "?=" and env_cc:
                            return env_cc, f"$CC (over {name}'s ?=)"
                        return value, f"{var} in {name}"
        path = folder / "CMakeLists.txt"
        if path.is_file():
            for lang, value in _CMAKE_CC.findall(path.read_text(errors="replace")):
                if (lang.upper() == "CXX") == cxx and "$" not in value:
                    return value, "CMAKE_COMPILER in CMakeLists.txt"
        if folder == root or (folder / ".git").exists() or folder.parent == folder:
            break
        folder = folder.parent
    return "", ""


@functools.lru_cache(maxsize=16)
def identify(command: str, where: str) -> Compiler:
    """`command` as `Compiler`, its kind from its own --version (`where`: how the build names it)."""
    path = shutil.which(command)
    if path is None:
        return Compiler(command, "", "", where)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return Compiler(command, "", "", where)
    first = out.splitlines()[0] if out else ""
    kind = "clang" if "clang" in out.lower() else "gcc" if "Free Software Foundation" in out else ""
    return Compiler(command, kind, first, where)
