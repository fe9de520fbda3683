"""Compiler flags carried in the source, for kernels the repo builds itself (issue 53): what the
compiler does with each form (real gcc, objdump, the loader's dispatch), and what the block looks
like in a file; the end-to-end runs on Makefile, CMake and Clang repos are in
test_flags_in_source_repos.py."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_kope import assert_close
from pytest_kope.candidate import Candidate
from pytest_kope.spec import KernelSpec, SourceFlags
from pytest_kope.toolchains.c import CToolchain
from pytest_kope.toolchains.flagblock import (
    BASELINE_ENV,
    carried,
    dispatches,
    has_clones,
    searchable,
    strip,
    write,
)
from pytest_kope.toolchains.repocc import identify, repo_compiler
from pytest_kope.toolchains.srcflags import forms

POLY_C = """\
// kope: kernel void poly(const float *x, float *y, int n)
// kope: flags -O2 | -O3 | -O3 -march=native
#include <stddef.h>

typedef float real;

void
poly(const real *x, real *y, int n) {
    for (int i = 0; i < n; i++) {
        real v = x[i];
        y[i] = ((((0.1f * v + 0.2f) * v + 0.3f) * v + 0.4f) * v + 0.5f) * v + 0.6f;
    }
}
"""
PROTO = "void poly(const float *x, float *y, int n)"
GCC = identify("gcc", "test")
x86_64 = pytest.mark.skipif(
    "x86_64" not in subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout,
    reason="target clones are an x86-64 form",
)


def _lib(tmp: Path, source: str, *flags: str, name: str = "k") -> Path:
    (tmp / f"{name}.c").write_text(source)
    out = tmp / f"lib{name}.so"
    subprocess.run(
        ["gcc", "-O2", "-fPIC", "-shared", *flags, str(tmp / f"{name}.c"), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def _code(lib: Path) -> str:
    """The disassembly without addresses, to compare code built two ways."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True)
    return "\n".join(line.split("\t", 1)[-1] for line in out.stdout.splitlines() if "\t" in line)


def test_the_o3_pragma_gives_the_code_o3_gives(tmp_path):
    """`#pragma GCC optimize("O3")` ahead of a kernel under -O2 is -O3 for it (gcc 12 applies it to
    every function defined after it): the same instructions, and not -O2's."""
    f = forms("-O3", "-O2", GCC)
    assert f.pragmas == ('#pragma GCC optimize("O3")',) and f.complete
    o2 = _code(_lib(tmp_path, POLY_C, name="o2"))
    o3 = _code(_lib(tmp_path, POLY_C, "-O3", name="o3"))
    pragma = _code(_lib(tmp_path, write(POLY_C, f, [PROTO]), name="pragma"))
    assert o3 != o2
    assert pragma == o3


def _machine_levels() -> list[str]:
    """The psABI levels this CPU has, as glibc's loader sees them (independent of gcc)."""
    loader = next((p for p in ("/lib64/ld-linux-x86-64.so.2",) if Path(p).exists()), None)
    if loader is None:
        pytest.skip("no x86-64 glibc loader to ask which psABI levels this CPU has")
    out = subprocess.run([loader, "--help"], capture_output=True, text=True).stdout
    return re.findall(r"(x86-64-v\d) \(supported", out)


@x86_64
def test_target_clones_dispatch_to_the_richest_level_this_cpu_has(tmp_path):
    f = forms("-O3 -march=native", "-O2", GCC)
    assert f.clones and all(c.startswith("arch=x86-64-v") for c in f.clones), f
    lib = _lib(tmp_path, write(POLY_C, f, [PROTO]))
    assert dispatches(lib)
    symbols = subprocess.run(["nm", str(lib)], capture_output=True, text=True).stdout
    offsets = {
        name: int(addr, 16)
        for addr, _, name in (line.split() for line in symbols.splitlines() if len(line.split()) == 3)
    }
    loaded = ctypes.CDLL(str(lib))
    address = ctypes.cast(loaded.poly, ctypes.c_void_p).value or 0
    base = next(
        int(line.split("-")[0], 16)
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(str(lib)) and line.split()[2] == "00000000"
    )
    chosen = next(name for name, at in offsets.items() if at == address - base and name.startswith("poly."))
    have = _machine_levels()
    expected = next(
        (f"poly.{c.replace('=', '_').replace('-', '_')}" for c in f.clones if c[5:] in have), None
    )
    assert chosen == (expected or "poly.default"), (chosen, have, f.clones)


@x86_64
def test_the_baseline_build_has_no_clones_and_computes_the_same(tmp_path):
    import numpy as np

    text = write(POLY_C, forms("-O3 -march=native", "-O2", GCC), [PROTO])
    cloned = _lib(tmp_path, text, name="cloned")
    held = _lib(tmp_path, text, "-march=x86-64", "-DKOPE_NO_CLONES", name="held")
    assert dispatches(cloned) and not dispatches(held)
    assert "zmm" not in _code(held) and "ymm" not in _code(held)  # no AVX on the fallback path
    x = np.random.default_rng(1).standard_normal(1001).astype(np.float32)
    outs = []
    for lib in (cloned, held):
        y = np.empty_like(x)
        ctypes.CDLL(str(lib)).poly(
            x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(x.size)
        )
        outs.append(y)
    assert_close(outs[0], outs[1], rtol=1e-5)  # norm-wise: FMA contraction moves values near zero


def test_the_block_is_readable_guarded_and_comes_off_whole():
    f = forms("-O3 -march=native", "-O2", GCC)
    text = write(POLY_C, f, [PROTO])
    block = text[text.index("/* pytest-kope: compiler flags") : text.index("end of compiler flags */")]
    assert "-O3" in block and "-march=native" in block and '#pragma GCC optimize("O3")' in block
    assert "#if defined(__GNUC__) && !defined(__clang__)" in block  # another compiler skips the pragma
    assert text.index("#include <stddef.h>") < text.index("/* pytest-kope")  # after the includes
    # the clone line stands right above the definition, whose return type has a line of its own
    assert "KOPE_CLONES /* pytest-kope: target clones, see the flags block above */\nvoid\npoly(" in text
    assert has_clones(text) and not has_clones(POLY_C)
    assert strip(text) == POLY_C
    assert write(POLY_C, forms("-O2", "-O2", GCC), [PROTO]) == POLY_C  # the build's own: no block


def test_what_is_committed_is_what_the_judge_builds():
    """The judge builds `carried(candidate)`; the commit bakes it; building the baked file again
    writes the same block: one file from search to branch."""
    spec = KernelSpec(kernels=(PROTO,), source_flags=SourceFlags("-O2", ("gcc", "test")))
    winner = Candidate(POLY_C, "poly.c", "c", {"flags": "-O3 -march=native"})
    built = carried(winner, spec)
    assert built.params["flags"] == "-O2"  # the build's own flags on its command line
    baked = CToolchain().bake(built.source, built.params)
    again = carried(Candidate(baked, "poly.c", "c", {"flags": "-O3 -march=native"}), spec)
    assert again.source == baked
    assert "// kope: flags -O2 | -O3 | -O3 -march=native" in baked  # the first value stays the build's
    assert carried(Candidate(baked, "poly.c", "c", {"flags": "-O2"}), spec).source == baked


def test_the_baseline_build_appends_the_baseline_instruction_set(monkeypatch):
    spec = KernelSpec(kernels=(PROTO,), source_flags=SourceFlags("-O2", ("gcc", "test")))
    monkeypatch.setenv(BASELINE_ENV, "1")
    held = carried(Candidate(POLY_C, "poly.c", "c", {"flags": "-O2"}), spec)
    assert held.params["flags"] == "-O2 -march=x86-64 -DKOPE_NO_CLONES" and held.source == POLY_C
    plain = KernelSpec(kernels=(PROTO,))  # pytest-kope builds it: flags on the command line, as before
    same = Candidate(POLY_C, "poly.c", "c", {"flags": "-O3 -march=native"})
    assert carried(same, plain) is same


def test_flags_with_no_source_form_are_not_searched_and_say_why():
    kept, dropped = searchable(["-O2", "-O3 -march=native", "-O2 -fopenmp", "-O2 -g"], "-O2", GCC)
    assert kept == ["-O2", "-O3 -march=native"]
    assert len(dropped) == 2 and "-fopenmp" in dropped[0] and "refuses it" in dropped[0], dropped
    assert "-g: no source form on gcc" in dropped[1], dropped
    several = forms("-O2 -mavx2 -mfma", "-O2", GCC)  # two features: the smallest level with both
    assert several.clones == ("arch=x86-64-v3",) and several.complete
    assert forms("-O2 -mavx2", "-O2", GCC).clones == ("avx2",)
    assert forms("-O3 -march=native", "-O2 -march=native", GCC).clones == ()  # the build has it already


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_clang_gets_its_own_forms():
    clang = identify("clang", "test")
    assert clang.kind == "clang"
    fast = forms("-O2 -ffast-math", "-O2", clang)
    assert fast.pragmas == ("#pragma float_control(precise, off)",) and fast.complete
    level = forms("-O3", "-O2", clang)
    assert not level.complete and "only on the command line" in level.missing[0][1]
    text = write(POLY_C, fast, [PROTO])
    assert "#if defined(__clang__)\n#pragma float_control(precise, off)\n#endif" in text


def test_the_repos_compiler_is_read_from_its_build(tmp_path, monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    src = tmp_path / "src" / "k.c"
    src.parent.mkdir()
    src.write_text(POLY_C)
    (tmp_path / ".git").mkdir()
    assert repo_compiler("make", tmp_path, src).read_from == "the system's default"
    (tmp_path / "Makefile").write_text("CC ?= gcc\nall:\n\t$(CC) -c src/k.c\n")
    assert repo_compiler("make", tmp_path, src).command == "gcc"
    monkeypatch.setenv("CC", "cc")
    assert repo_compiler("make", tmp_path, src).command == "cc"  # ?= yields to $CC, as make does
    assert repo_compiler("make CC=gcc", tmp_path, src).command == "gcc"  # the command line wins
    (tmp_path / "Makefile").unlink()
    (tmp_path / "CMakeLists.txt").write_text('set(CMAKE_C_COMPILER "gcc")\nproject(x C)\n')
    assert repo_compiler("cmake -S . -B b", tmp_path, src).read_from == "CMAKE_COMPILER in CMakeLists.txt"
    assert repo_compiler("cmake -S . -B b -DCMAKE_C_COMPILER=cc", tmp_path, src).command == "cc"
    assert repo_compiler("", tmp_path, src).kind in ("gcc", "clang")


def test_an_operator_beside_a_makefile_searches_the_values_with_a_form(tmp_path, monkeypatch):
    """No `build=`: pytest-kope builds the kernel for judging, the Makefile beside it after a merge."""
    from pytest_kope.operator import Operator
    from pytest_kope.spec import parse_spec

    monkeypatch.delenv("CC", raising=False)
    (tmp_path / ".git").mkdir()
    source = tmp_path / "poly.c"
    source.write_text(POLY_C.replace("-O3 -march=native", "-O3 -march=native | -O2 -fopenmp"))
    alone = Operator("poly", source, "c", "poly")
    assert alone.source_flags is None and alone.searched_space == alone.spec.space  # as before
    (tmp_path / "Makefile").write_text("CC = gcc\nlibpoly.so: poly.c\n\t$(CC) -O2 -shared -fPIC -o $@ $<\n")
    op = Operator("poly", source, "c", "poly")
    assert op.source_flags == SourceFlags("-O2", ("gcc", "CC in Makefile"))
    assert op.searched_space.axes["flags"] == ("-O2", "-O3", "-O3 -march=native")
    compiler, unsearched = op.flags_unsearched()
    assert compiler.startswith("gcc ") and len(unsearched) == 1 and "-fopenmp" in unsearched[0]
    spec = op.build_context(parse_spec(source.read_text()))
    built = carried(Candidate(source.read_text(), "poly.c", "c", {"flags": "-O3"}), spec)
    assert built.params["flags"] == "-O2" and '#pragma GCC optimize("O3")' in built.source
