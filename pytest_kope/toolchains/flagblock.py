"""The marked block that carries a `flags` value in the source (`srcflags.forms`), and the build's
view of a candidate of a kernel the repo builds itself (`carried`).

The block stands after the file's includes, ahead of every function, so its pragmas reach every
kernel; each kernel's definition gets one marked line, `KOPE_CLONES`, which the block defines as the
target clones, or as nothing where they do not apply (another compiler, another architecture, or
`-DKOPE_NO_CLONES`: the build that holds the instruction set to the baseline, so its tests run the
fallback that a machine without the instruction set runs). Every form is guarded by the compiler it
is for, so the file still builds under another one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..candidate import Candidate
from ..spec import FLAGS, KernelSpec
from .repocc import Compiler, identify
from .srcflags import Forms, forms

BEGIN = "/* pytest-kope: compiler flags carried in the source"
END = "/* pytest-kope: end of compiler flags */"
CLONES_LINE = "KOPE_CLONES /* pytest-kope: target clones, see the flags block above */"
NO_CLONES = "KOPE_NO_CLONES"
BASELINE_ENV = "KOPE_BASELINE_ISA"  # set: build with the instruction set held to the baseline
BASELINE_FLAGS = ("-march=x86-64", f"-D{NO_CLONES}")
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n", re.S)
_GUARD = {"gcc": "defined(__GNUC__) && !defined(__clang__)", "clang": "defined(__clang__)"}


def carried(candidate: Candidate, spec: KernelSpec) -> Candidate:
    """What a build compiles for `candidate`: where the repo builds the kernel itself
    (`spec.source_flags`), its `flags` value written into the source and the build's own flags on
    the command line (plus the baseline instruction set when BASELINE_ENV is set); else `candidate`."""
    own = spec.source_flags
    if own is None:
        return candidate
    value = str(candidate.params.get(FLAGS, own.held))
    text = candidate.source
    if value != own.held:
        text = write(strip(text), forms(value, own.held, identify(*own.compiler)), spec.kernels)
    flags = " ".join([own.held, *(BASELINE_FLAGS if os.environ.get(BASELINE_ENV) else ())])
    if text == candidate.source and flags == value:
        return candidate
    return replace(candidate, source=text, params={**candidate.params, FLAGS: flags})


def has_clones(text: str) -> bool:
    """Whether a source carries an instruction-set choice (its baseline build must be tested)."""
    block = _BLOCK.search(text)
    return block is not None and "target_clones" in block.group(0)


def dispatches(lib: Path) -> bool:
    """Whether a built library still picks clones at load time (an indirect function, nm type `i`)."""
    nm = shutil.which("nm")
    if nm is None:
        return False
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    return any(len(parts) >= 3 and parts[-2] == "i" for parts in (line.split() for line in out.splitlines()))


def strip(text: str) -> str:
    """`text` without a flags block and its clone lines."""
    text = _BLOCK.sub("", text)
    return "".join(line for line in text.splitlines(keepends=True) if line.strip() != CLONES_LINE)


def write(text: str, carried_forms: Forms, kernels: Sequence[str]) -> str:
    """`text` (without a block) with `carried_forms` in a block after its includes and the clone line
    ahead of each kernel's definition (a kernel not found there is declared with them in the block)."""
    kind = carried_forms.compiler.kind
    if kind not in _GUARD or not (carried_forms.pragmas or carried_forms.clones):
        return text
    lines = text.splitlines(keepends=True)
    names = [_name(k) for k in kernels]
    starts = {name: _definition(lines, name) for name in names}
    undefined = [k for k, n in zip(kernels, names) if starts[n] is None]
    block = _block(carried_forms, kind, undefined if carried_forms.clones else [])
    firsts = [s for s in starts.values() if s is not None]
    at = _after_includes(lines, min(firsts) if firsts else len(lines))
    out = list(lines)
    if carried_forms.clones:
        for start in sorted((s for s in firsts if s >= at), reverse=True):
            out.insert(start, CLONES_LINE + "\n")
    out.insert(at, block)
    return "".join(out)


def _block(f: Forms, kind: str, declared: Sequence[str]) -> str:
    number = re.search(r"\d+\.\d+(?:\.\d+)?", f.compiler.version)
    width = max(len(flag) for flag, _ in f.carried)
    lines = [
        f"{BEGIN}, for {kind} {number.group(0) if number else ''}".rstrip() + ":",
        *(f" *   {flag:<{width}}  {how}" for flag, how in f.carried),
    ]
    if f.clones:
        lines.append(f" * -D{NO_CLONES} builds the baseline instruction set alone (the fallback). */")
    else:
        lines[-1] += " */"
    if f.pragmas:
        lines += [f"#if {_GUARD[kind]}", *f.pragmas, "#endif"]
    if f.clones:
        entries = ", ".join(f'"{c}"' for c in (*f.clones, "default"))
        lines += [
            f"#if {_GUARD[kind]} && defined(__x86_64__) && !defined({NO_CLONES})",
            f"#define KOPE_CLONES __attribute__((target_clones({entries})))",
            "#else",
            "#define KOPE_CLONES",
            "#endif",
            *(f"KOPE_CLONES {k.rstrip(';')};" for k in declared),
        ]
    return "\n".join([*lines, END]) + "\n"


def _definition(lines: list[str], name: str) -> int | None:
    """The line a definition of function `name` starts on (its return type's line), if one is found."""
    call = re.compile(rf"^[\w \t\*]*\b{re.escape(name)}\s*\(")
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("//", "/*", "*", "#")) or not call.match(line):
            continue
        after = "".join(lines[i : i + 40])
        head = after[: after.find("(") + 1]
        close = _matching_paren(after, len(head) - 1)
        if close is None or not after[close + 1 :].lstrip().startswith("{"):
            continue
        if head.strip().startswith(name) and i > 0 and re.fullmatch(r"[\w \t\*]+\n", lines[i - 1]):
            return i - 1  # `void\nname(...)`: the return type stands on the line above
        return i
    return None


def _name(prototype: str) -> str:
    found = re.search(r"(\w+)\s*\(", prototype)
    return found.group(1) if found else prototype


def _matching_paren(text: str, at: int) -> int | None:
    depth = 0
    for j in range(at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return j
    return None


def _after_includes(lines: list[str], before: int) -> int:
    """The line after the last `#include` ahead of line `before` (0 when there is none)."""
    last = -1
    for i, line in enumerate(lines[:before]):
        if re.match(r"^\s*#\s*include\b", line):
            last = i
    return last + 1


def describe(spec: KernelSpec, value: str) -> list[str]:
    """For the report and the pull request: how `value` is carried in the source (empty when the
    kernel is not one the repo builds itself, or the value is the build's own)."""
    own = spec.source_flags
    if own is None or value == own.held:
        return []
    return forms(value, own.held, identify(*own.compiler)).describe()


def searchable(values: Sequence[str], held: str, compiler: Compiler) -> tuple[list[str], list[str]]:
    """The `flags` values whose every flag has a source form on `compiler` (the build's own first),
    and one phrase per value left out, naming the flag and why."""
    kept, dropped = [held], []
    for value in values:
        if value == held:
            continue
        f = forms(value, held, compiler)
        if f.complete:
            kept.append(value)
        else:
            dropped.append(f"{value!r} ({'; '.join(f'{flag}: {why}' for flag, why in f.missing)})")
    return kept, dropped
