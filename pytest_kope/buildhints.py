"""What a failed build's log tells its user: the compiler's first error, whole, and, for a header the
compiler cannot find, the include directories the repo's own build files name, as the marker option
that adds them.

The first error is the one to fix (later ones often follow from it); a log cut after its file name
shows none of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

# `file:line[:col]: [fatal ]error: ...` (gcc, clang, nvcc, bisheng)
_ERROR = re.compile(r"^(?P<file>[^\s:][^:]*):\d+:(?:\d+:)?\s*(?:fatal )?error\b")
# gcc: `fatal error: x.h: No such file or directory`; clang: `fatal error: 'x.h' file not found`
_MISSING = re.compile(r"fatal error: '?(?P<header>[^'\s:]+)'?(?:: No such file or directory| file not found)")
_MAKE_FILES = ("Makefile", "makefile", "GNUmakefile")
_CMAKE_INCLUDES = re.compile(r"\b(target_)?include_directories\s*\(([^)]*)\)", re.I)
_CMAKE_WORDS = {"SYSTEM", "BEFORE", "AFTER", "PRIVATE", "PUBLIC", "INTERFACE"}
# a build file's own folder, spelled as make or CMake spell it
_HERE = re.compile(
    r"^(?:\$\(CURDIR\)|\$\{(?:CMAKE_CURRENT_SOURCE_DIR|CMAKE_SOURCE_DIR|PROJECT_SOURCE_DIR)\})/?"
)


def first_error(log: str, names: Mapping[str, str] | None = None) -> str:
    """The compiler's first error with the context lines under it (source line, caret), up to the next
    diagnostic; without a `file:line: error:` line, the first line that mentions an error. `names`
    maps a file name as the compiler saw it (the build's copy) to the path to show instead."""
    lines = [line for line in log.splitlines() if not line.startswith("$ ")]  # the command itself
    for i, line in enumerate(lines):
        found = _ERROR.match(line)
        if found:
            shown = (names or {}).get(found["file"])
            head = shown + line[len(found["file"]) :] if shown else line
            context = []
            for following in lines[i + 1 :]:
                if not following[:1].isspace() or not following.strip():
                    break
                context.append(following)
            return "\n".join([head, *context])
    said = [line for line in lines if line.strip()]
    return next((line for line in said if "error" in line.lower()), said[0] if said else "")


def missing_header(log: str) -> str:
    """The header the compiler could not find ("" when none)."""
    found = _MISSING.search(log)
    return found["header"] if found else ""


def include_hint(
    header: str, source: Path, home: Path, have: Iterable[Path], test_file: Path, ini: Path | None
) -> str:
    """How to give the build the folder `header` is in: the include directories a Makefile or
    CMakeLists.txt at the repo's root or beside the kernel names (those that hold the header first),
    else the folders of the repo that hold it, as the marker's `include=` and the ini's `kope_include`
    ("" when no folder is known)."""
    have = set(have)
    named = [(d, why) for d, why in _build_file_dirs((home, source.parent), home) if d not in have]
    holding = [(d, why) for d, why in named if (d / header).is_file()]
    holding = holding or [(d, "") for d in _folders_holding(home, header) if d not in have]
    chosen = holding or named
    if not chosen:
        return ""
    where = ", ".join(_rel(d, home) + (f" ({why})" if why else "") for d, why in chosen)
    said = f"{header} is in {where}" if holding else f"the repo's build names include directories {where}"
    dirs = [d for d, _ in chosen]
    marker = ", ".join(f'"{_rel(d, test_file.parent)}"' for d in dirs)
    ini_dirs = " ".join(_rel(d, ini.parent if ini else home) for d in dirs)
    return (
        f"{source.name} includes {header}; {said}: add include={marker if len(dirs) == 1 else f'[{marker}]'}"
        f" to the kope marker in {_rel(test_file, home)}, or `kope_include = {ini_dirs}` to"
        f" {_rel(ini, home) if ini else 'the [pytest] section of your ini file'}"
    )


def _build_file_dirs(folders: Iterable[Path], home: Path) -> list[tuple[Path, str]]:
    """(existing folder, where a build file names it) for every `-I` of a Makefile and every
    `[target_]include_directories` of a CMakeLists.txt in `folders`."""
    found: dict[Path, str] = {}
    for folder in dict.fromkeys(folders):
        for name in (*_MAKE_FILES, "CMakeLists.txt"):
            path = folder / name
            if not path.is_file():
                continue
            text = path.read_text(errors="replace")
            cmake = name == "CMakeLists.txt"
            for word in _cmake_dirs(text) if cmake else _make_dirs(text):
                spelled = _HERE.sub("", word.strip("\"'")) or "."
                if "$" in spelled:  # another variable: its value is the build's to know
                    continue
                d = (folder / spelled).resolve()
                if d.is_dir():
                    found.setdefault(d, f"{_rel(path, home)}: {word if cmake else '-I' + word}")
    return list(found.items())


def _make_dirs(text: str) -> list[str]:
    return re.findall(r"(?<![\w-])-I\s*([^\s;]+)", text)


def _cmake_dirs(text: str) -> list[str]:
    dirs: list[str] = []
    for target, body in _CMAKE_INCLUDES.findall(text):
        words = body.split()[1 if target else 0 :]
        for word in words:
            word = re.sub(r"^\$<BUILD_INTERFACE:(.*)>$", r"\1", word)
            if word.upper() not in _CMAKE_WORDS and not word.startswith("$<"):
                dirs.append(word)
    return dirs


def _folders_holding(home: Path, header: str, most: int = 3, files: int = 20000) -> list[Path]:
    """Folders under `home` (hidden ones skipped) that hold `header`; the walk stops after `files`."""
    found: list[Path] = []
    seen = 0
    for folder, subdirs, names in os.walk(home):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        seen += len(names)
        if (Path(folder) / header).is_file():
            found.append(Path(folder))
        if len(found) >= most or seen > files:
            break
    return found


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)
