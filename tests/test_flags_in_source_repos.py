"""Repos that build their kernels themselves get the flags the search found, from the committed
source (issue 53): a Makefile repo and a CMake repo with their own -O2, and a Makefile repo that
builds with Clang. Each is optimized end to end by the tuner; then the `kope/` branch is built by the
repo's own tool alone (no pytest-kope) and its library timed against main's, and the branch's tests
run with the instruction set held to the baseline (the fallback a machine without it runs).

The timing here is a sanity ordering with a wide margin (this machine is shared); the speedup as a
figure is measured in bench/ownbuild_flags.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from op_repos import UNJAILED, git

from pytest_kope.toolchains.flagblock import BASELINE_ENV, dispatches

POLY_C = """\
// kope: kernel void poly(const float *x, float *y, int n)
// kope: flags -O2 | -O3 | -O3 -march=native
// A degree-16 polynomial by Horner's rule: compute-bound, so vector width shows.
#include <stddef.h>

#define H(c) p = p * v + (c);

void poly(const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) {
        float v = x[i], p = 1.0f;
        H(0.5f) H(0.25f) H(0.125f) H(0.0625f) H(0.5f) H(0.25f) H(0.125f) H(0.0625f)
        H(0.5f) H(0.25f) H(0.125f) H(0.0625f) H(0.5f) H(0.25f) H(0.125f) H(0.0625f)
        y[i] = p;
    }
}
"""

POLY_TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("poly", source="../src/poly.c", root="..", build={build!r},
                              library={library!r})
COEFFS = [0.5, 0.25, 0.125, 0.0625] * 4


def reference(x):
    v, p = x.astype(np.float64), np.ones(x.size)
    for c in COEFFS:
        p = p * v + c
    return p


@pytest.mark.parametrize("n", [1, 7, 100, 4099])
def test_poly(kernel, rng, n):
    x = rng.uniform(-1, 1, n).astype(np.float32)
    y = np.empty_like(x)
    kernel.poly(x, y, n)
    assert_close(y, reference(x), rtol=1e-5)


def test_poly_speed(kernel, rng, kope_bench):
    x = rng.uniform(-1, 1, 1 << 20).astype(np.float32)
    kope_bench(kernel.poly, x, np.empty_like(x), x.size)
"""

MAKEFILE = """\
CFLAGS ?= -O2
lib/libpoly.so: src/poly.c
\tmkdir -p lib && $(CC) $(CFLAGS) -fPIC -shared -o $@ src/poly.c
"""

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(ops C)
add_library(poly SHARED src/poly.c)
target_compile_options(poly PRIVATE -O2)
"""

ROWSUM_C = """\
// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)
// kope: flags -O2 | -O2 -ffast-math | -O3 -march=native
void rowsum(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float s = 0.0f;
        for (int c = 0; c < cols; c++) s += x[(long)r * cols + c];
        y[r] = s;
    }
}
"""

ROWSUM_TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("rowsum", source="../src/rowsum.c", root="..",
                              build='make -s CFLAGS="{cflags}"', library="lib/librowsum.so")


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 17), (64, 1000)])
def test_rowsum(kernel, rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = np.empty(rows, dtype=np.float32)
    kernel.rowsum(x, y, rows, cols)
    assert_close(y, x.astype(np.float64).sum(axis=1), rtol=1e-5)


def test_rowsum_speed(kernel, rng, kope_bench):
    x = rng.standard_normal((2048, 2048)).astype(np.float32)
    kope_bench(kernel.rowsum, x, np.empty(2048, dtype=np.float32), 2048, 2048)
"""

CLANG_MAKEFILE = """\
CC = clang
CFLAGS ?= -O2
lib/librowsum.so: src/rowsum.c
\tmkdir -p lib && $(CC) $(CFLAGS) -fPIC -shared -o $@ src/rowsum.c
"""

MAKE_BUILD = ('make -s CFLAGS="{cflags}"', "lib/libpoly.so")
CMAKE_BUILD = (
    "cmake -S . -B build -DCMAKE_C_FLAGS={cflags} >/dev/null && cmake --build build >/dev/null",
    "build/libpoly.so",
)


def make_repo(root: Path, files: dict[str, str]) -> Path:
    """A git repo of `files` (path: text) with a pytest.ini, committed on main."""
    for name, text in {**files, "pytest.ini": "[pytest]\nfilterwarnings = error\n"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / ".gitignore").write_text("lib/\nbuild/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "kernels")
    return root


def optimize(repo: Path, budget: int = 4) -> tuple[dict[str, Any], str]:
    """A tuner run; its operator's report entry (skips, saying so, when a busy machine left no
    verified winner) and the run's output."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "--kope-optimize", "--kope-agent", "tuner"]
    done = subprocess.run(
        [*cmd, "--kope-budget", str(budget), *UNJAILED], cwd=repo, capture_output=True, text=True, timeout=900
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    (path,) = sorted((repo / ".kope" / "runs").glob("*/report.json"))[-1:]
    (op,) = json.loads(path.read_text())["operators"]
    busy = (op.get("machine_busy") or {}).get("median", 0.0)
    if not op["verified"] and busy >= 0.5:
        pytest.skip(
            f"no verified winner: others used {busy:.0%} of the machine during the timings ({op['note']})"
        )
    assert op["verified"], (op["note"], op["outcomes"], out[-3000:])
    return op, out


def build_branch(repo: Path, ref: str, where: Path, command: list[list[str]], library: str) -> Path:
    """`ref`'s tree built by the repo's own tool alone, as a user would after the merge."""
    where.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    for step in command:
        subprocess.run(step, cwd=where, check=True, capture_output=True)
    return where / library


def paired_ratio(before: Path, after: Path, fn: str, args: tuple[Any, ...], rounds: int = 15) -> float:
    """Median of per-round (before / after) times of one call, the two libraries interleaved."""
    libs = [getattr(ctypes.CDLL(str(p)), fn) for p in (before, after)]

    def once(f: Any) -> float:
        t0 = time.perf_counter()
        f(*args)
        return time.perf_counter() - t0

    for f in libs:
        once(f)
    return statistics.median(once(libs[0]) / once(libs[1]) for _ in range(rounds))


def _poly_args() -> tuple[Any, ...]:
    x = np.random.default_rng().uniform(-1, 1, 1 << 20).astype(np.float32)
    y = np.empty_like(x)
    return x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(x.size), x, y


def baseline_isa_run(repo: Path, ref: str, where: Path) -> subprocess.CompletedProcess[str]:
    """Plain pytest on `ref`'s tree with the build held to the baseline instruction set."""
    where.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    env = {**os.environ, BASELINE_ENV: "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _check_poly_winner(
    repo: Path, tmp: Path, op: dict[str, Any], out: str, build: list[list[str]], lib: str
) -> None:
    assert "compiler flags carried in the source for gcc" in out, out[-3000:]
    committed = git(repo, "show", "kope/poly:src/poly.c")
    assert '#pragma GCC optimize("O3")' in committed, committed
    assert 'target_clones("arch=x86-64-v' in committed and '"default")' in committed, committed
    assert "// kope: flags -O2 | -O3 | -O3 -march=native" in committed  # the build's own stays first
    assert any("target_clones" in line for line in op["flags_in_source"]), op["flags_in_source"]
    assert op["baseline_isa"]["passed"] > 0 and not op["baseline_isa"]["failed"], op["baseline_isa"]
    body = git(repo, "log", "-1", "--format=%B", "kope/poly")
    assert "Compiler flags written into the source" in body and "-march=native: target_clones(" in body
    md = next((repo / ".kope" / "runs").glob("*/report.md")).read_text()
    assert "Compiler flags written into the source" in md and "held to the baseline" in md
    before = build_branch(repo, "main", tmp / "main", build, lib)
    after = build_branch(repo, "kope/poly", tmp / "merged", build, lib)
    assert dispatches(after) and not dispatches(before)
    *args, _, _ = _poly_args()
    ratio = paired_ratio(before, after, "poly", tuple(args))
    print(f"own build after the merge: {ratio:.2f}x; verified {op['speedup']:.2f}x")
    assert ratio > 1.3, ratio  # a sanity ordering: the figure is bench/ownbuild_flags.py's
    held = baseline_isa_run(repo, "kope/poly", tmp / "held")
    assert held.returncode == 0 and "5 passed" in held.stdout, held.stdout[-3000:] + held.stderr[-2000:]


def test_a_makefile_repo_commits_o3_and_clones_that_its_make_builds(tmp_path):
    build, library = MAKE_BUILD
    repo = make_repo(
        tmp_path / "makeops",
        {
            "Makefile": MAKEFILE,
            "src/poly.c": POLY_C,
            "tests/test_poly.py": POLY_TESTS.format(build=build, library=library),
        },
    )
    op, out = optimize(repo)
    assert op["best"]["params"]["flags"] == "-O3 -march=native", op["best"]
    _check_poly_winner(repo, tmp_path, op, out, [["make", "-s"]], library)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_a_cmake_repo_commits_o3_and_clones_that_cmake_builds(tmp_path):
    build, library = CMAKE_BUILD
    repo = make_repo(
        tmp_path / "cmakeops",
        {
            "CMakeLists.txt": CMAKELISTS,
            "src/poly.c": POLY_C,
            "tests/test_poly.py": POLY_TESTS.format(build=build, library=library),
        },
    )
    op, out = optimize(repo)
    assert op["best"]["params"]["flags"] == "-O3 -march=native", op["best"]
    steps = [["cmake", "-S", ".", "-B", "build"], ["cmake", "--build", "build"]]
    _check_poly_winner(repo, tmp_path, op, out, steps, library)


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed (apt-get install clang)")
def test_a_clang_repo_gets_the_forms_clang_honours_and_is_told_the_rest(tmp_path):
    repo = make_repo(
        tmp_path / "clangops",
        {"Makefile": CLANG_MAKEFILE, "src/rowsum.c": ROWSUM_C, "tests/test_rowsum.py": ROWSUM_TESTS},
    )
    op, out = optimize(repo, budget=3)
    assert "compiler flags carried in the source for clang" in out, out[-3000:]
    (line,) = [ln for ln in out.splitlines() if "flags with no source form on clang" in ln]
    assert "'-O3 -march=native'" in line and "not searched" in line, line
    assert op["best"]["params"]["flags"] == "-O2 -ffast-math", op["best"]
    committed = git(repo, "show", "kope/rowsum:src/rowsum.c")
    assert "#if defined(__clang__)\n#pragma float_control(precise, off)\n#endif" in committed, committed
    assert "baseline_isa" not in op  # no instruction-set choice: nothing to hold to the baseline
    before = build_branch(repo, "main", tmp_path / "main", [["make", "-s"]], "lib/librowsum.so")
    after = build_branch(repo, "kope/rowsum", tmp_path / "merged", [["make", "-s"]], "lib/librowsum.so")
    x = np.random.default_rng().standard_normal((2048, 2048)).astype(np.float32)
    y = np.empty(2048, dtype=np.float32)
    args = (x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), 2048, 2048)
    ratio = paired_ratio(before, after, "rowsum", args)
    print(f"clang's own build after the merge: {ratio:.2f}x; verified {op['speedup']:.2f}x")
    assert ratio > 1.3, ratio
