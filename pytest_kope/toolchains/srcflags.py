"""Compiler flags as source the repo's own compiler honours, for a kernel the repo builds itself.

A `kope/` branch carries files, never a Makefile's CFLAGS: a `flags` value reaches the repo's own
build only inside the committed source. Each flag (beyond those the build already passes) becomes a
form its compiler reads from the file:

- GCC: `#pragma GCC optimize("O3")` for -O levels and -f options, `#pragma GCC target("...")` for
  tuning (-mtune, -mprefer-vector-width), and for an instruction-set choice (-march, -m<isa>)
  `target_clones("arch=x86-64-v4", ..., "default")` on each kernel: the loader picks the richest
  clone the CPU has, and the `default` clone is the build's own code, so the file runs wherever the
  repo's baseline runs (never a bare `target("avx512f")`, which faults on a CPU without it);
- Clang: `#pragma clang optimize off` (-O0), `#pragma float_control(precise, off)` (-ffast-math),
  `#pragma clang fp ...`, and the same clones by feature name where its `target_clones` exports the
  kernel under its own name (Clang 14's does not).

An instruction-set choice is read as the x86-64 psABI levels it reaches (the compiler's own
predefined macros under those flags): `-march=native` is whatever this machine has, today or tomorrow.
Every form is compiled once by the repo's compiler with -Werror (a probe of pytest-kope's own text,
never a candidate's): a flag whose form that compiler refuses has none, and the run does not search
a value that holds one.
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .repocc import Compiler

# The x86-64 psABI levels (what `-march=x86-64-vN` means), each by the macros its features define.
_V2 = frozenset({"SSE3", "SSSE3", "SSE4_1", "SSE4_2", "POPCNT"})
_V3 = _V2 | {"AVX", "AVX2", "BMI", "BMI2", "F16C", "FMA", "LZCNT", "MOVBE"}
_V4 = _V3 | {"AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL"}
LEVELS: tuple[tuple[str, frozenset[str]], ...] = (("x86-64-v2", _V2), ("x86-64-v3", _V3), ("x86-64-v4", _V4))
CLANG_LEVEL_CLONE = {"x86-64-v2": "sse4.2", "x86-64-v3": "avx2", "x86-64-v4": "avx512f"}  # one feature each
_CLANG_F = {
    "-ffast-math": "#pragma float_control(precise, off)",
    "-ffp-contract=fast": "#pragma clang fp contract(fast)",
    "-fassociative-math": "#pragma clang fp reassociate(on)",
}
_TUNING = re.compile(r"^-m(tune=[\w.-]+|prefer-vector-width=\w+)$")
_ISA = re.compile(r"^-m(?:arch=[\w.-]+|(?:no-)?[a-z][a-z0-9.]*)$")


@dataclass(frozen=True)
class Forms:
    """One `flags` value as source: file-level pragmas, target clones on every kernel (entries before
    "default"; none when the value makes no instruction-set choice), and, for the reader, how each
    flag is carried or why it has no form on this compiler."""

    flags: str
    compiler: Compiler
    pragmas: tuple[str, ...] = ()
    clones: tuple[str, ...] = ()
    carried: tuple[tuple[str, str], ...] = ()  # (flag, the form that carries it)
    missing: tuple[tuple[str, str], ...] = ()  # (flag, why it has no form)

    @property
    def complete(self) -> bool:
        """Every flag of the value reaches the repo's build from the source."""
        return not self.missing

    def describe(self) -> list[str]:
        """One line per flag: what carries it (for the report and the pull request)."""
        return [f"{flag}: {how}" for flag, how in self.carried]


@functools.lru_cache(maxsize=256)
def forms(flags: str, held: str, compiler: Compiler) -> Forms:
    """`flags` as source for `compiler`, given that the build's command line passes `held` already
    (flags in both need no form). Each form is checked by compiling it (`_probe`)."""
    own = set(_split(held))
    tokens = [t for t in _split(flags) if t not in own]
    pragmas: list[str] = []
    carried: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    isa = [t for t in tokens if _ISA.match(t) and not _TUNING.match(t)]
    for token in (t for t in tokens if t not in isa):
        line, why = _pragma(token, compiler)
        why = why or _probe(compiler, (line,), ())
        if why:
            missing.append((token, why))
        else:
            pragmas.append(line)
            carried.append((token, line))
    clones: tuple[str, ...] = ()
    if isa:
        clones, why = _clones([t for t in _split(held) if _ISA.match(t)], isa, compiler)
        why = why or _probe(compiler, (), clones)
        if why:
            missing += [(t, why) for t in isa]
            clones = ()
        elif clones:
            attribute = ", ".join(f'"{c}"' for c in (*clones, "default"))
            carried.append((" ".join(isa), f"target_clones({attribute}) on each kernel"))
    return Forms(flags, compiler, tuple(pragmas), clones, tuple(carried), tuple(missing))


def _split(flags: str) -> list[str]:
    try:
        return shlex.split(flags)
    except ValueError:
        return flags.split()


def _pragma(token: str, compiler: Compiler) -> tuple[str, str]:
    """The file-level pragma for one optimization or tuning flag, or why there is none."""
    level = re.fullmatch(r"-O([0-3sgz]|fast)?", token)
    if compiler.kind == "gcc":
        if level:
            return f'#pragma GCC optimize("O{level.group(1) or "1"}")', ""
        if token.startswith("-f") and len(token) > 2:
            return f'#pragma GCC optimize("{token[2:]}")', ""
        tuning = _TUNING.match(token)
        if tuning:
            return f'#pragma GCC target("{tuning.group(1)}")', ""
    elif compiler.kind == "clang":
        if token == "-O0":
            return "#pragma clang optimize off", ""
        if token in _CLANG_F:
            return _CLANG_F[token], ""
        if level:
            return "", "Clang sets its optimization level only on the command line"
    return "", f"no source form on {compiler.kind or compiler.command}"


def _clones(held: list[str], isa: list[str], compiler: Compiler) -> tuple[tuple[str, ...], str]:
    """Target clones for an instruction-set choice, beyond what the build's own flags reach: a
    choice that is exactly a psABI level (`-march=native` here, `-march=haswell`) is that level and
    the one below it; a lone `-m<isa>` is its feature; any other set rounds up to the smallest
    level that holds it (the loader runs that clone only where all of the level is there)."""
    if compiler.kind not in ("gcc", "clang"):
        return (), f"no source form on {compiler.command}"
    macros = _isa_macros(compiler.command, tuple(held + isa))
    if macros is None:
        return (), f"{compiler.command} does not take {' '.join(isa)}"
    if not macros:
        return (), "target clones are an x86-64 form; this compiler does not target x86-64"
    base = _isa_macros(compiler.command, tuple(held)) or frozenset()
    if macros <= base:
        return (), ""  # nothing beyond the build's own instruction set
    above = [name for name, needs in LEVELS if not needs <= base]
    exact = [name for name, needs in LEVELS if needs == macros and name in above]
    features = [t[2:] for t in isa if not t.startswith(("-march=", "-mno-"))]
    if exact:
        at = above.index(exact[0])
        chosen = above[max(0, at - 1) : at + 1][::-1]
    elif len(isa) == 1 and len(features) == 1:
        return (features[0],), ""
    else:
        chosen = [next(name for name, needs in LEVELS if macros <= needs)]
    if compiler.kind == "clang":
        return tuple(CLANG_LEVEL_CLONE[c] for c in chosen), ""
    return tuple(f"arch={c}" for c in chosen), ""


@functools.lru_cache(maxsize=64)
def _isa_macros(cc: str, flags: tuple[str, ...]) -> frozenset[str] | None:
    """The x86 feature macros `cc` predefines under `flags` (empty off x86-64; None if it refuses them)."""
    try:
        out = subprocess.run(
            [cc, *flags, "-dM", "-E", "-x", "c", "/dev/null"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    if "#define __x86_64__ 1" not in out.stdout:
        return frozenset()
    return frozenset(re.findall(r"#define __(\w+)__ 1", out.stdout)) & LEVELS[-1][1]


@functools.lru_cache(maxsize=256)
def _probe(compiler: Compiler, pragmas: tuple[str, ...], clones: tuple[str, ...]) -> str:
    """Why `compiler` refuses these forms ("" when it takes them): a shared library of one kernel is
    built with them under -Werror, and a cloned kernel must be exported under its own name."""
    if not pragmas and not clones:
        return ""
    attribute = (
        "__attribute__((target_clones(" + ", ".join(f'"{c}"' for c in (*clones, "default")) + ")))\n"
        if clones
        else ""
    )
    body = "void kope_probe(float *y, int n) { for (int i = 0; i < n; i++) y[i] = y[i] * 2.0f + 1.0f; }\n"
    with tempfile.TemporaryDirectory(prefix="kope-flagprobe-") as tmp:
        src, lib = Path(tmp) / "probe.c", Path(tmp) / "probe.so"
        src.write_text("".join(line + "\n" for line in pragmas) + attribute + body)
        try:
            done = subprocess.run(
                [compiler.command, "-O2", "-fPIC", "-shared", "-Werror", str(src), "-o", str(lib)],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return f"{compiler.command} did not run ({e})"
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
            return f"{compiler.name()} refuses it: {first.replace(str(src), 'probe.c').strip()[:200]}"
        if clones and not _exports(lib, "kope_probe"):
            return f"{compiler.name()}'s target_clones does not export a kernel under its own name"
    return ""


def _exports(lib: Path, name: str) -> bool:
    nm = shutil.which("nm")
    if nm is None:
        return False
    out = subprocess.run([nm, "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    return any(line.split()[-1:] == [name] for line in out.splitlines())
