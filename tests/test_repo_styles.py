"""Operator repos written the way teams write them, optimized end to end with default options.

One repo per style, each a real git repo in a tmp dir, judged by real gcc in real children:
- `team`: tests apart from kernels (`tests/` and `kernels/`), a header the kernel includes
  (`include=`), a second source built with it (`source=[...]`), a test class, a module-scoped
  parametrized fixture, fixed seeds (`np.random.default_rng(0)`, `np.random.seed`),
  `numpy.testing.assert_allclose`, `pytest.approx`, an in-place kernel and `filterwarnings = error`;
- `cmakeops`: a kernel built by the repo's own CMake project (`build=`, `library=`, `root=`), with
  `src/`, `include/` and `tests/` apart;
- the same repo run with pytest's rootdir elsewhere (as a `--kope-db PATH` typed as two words once
  made it): the run finds the repo from the operator's source.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from op_repos import git

COMMON_H = """\
#pragma once
/* shared by every kernel of the repo */
static inline float kope_axpy_one(float a, float x, float y) { return a * x + y; }
"""

UTIL_C = """\
/* a helper in a source of its own, built with every candidate of saxpy.c */
long saxpy_chunk(long n) { return n < 4096 ? n : 4096; }
"""

SAXPY_C = """\
// kope: kernel void saxpy(const float *x, float *y, float a, long n)
// kope: inplace y
// kope: param UNROLL = 1 | 4
// kope: flags -O0 | -O2 -march=native
#include "common.h"
long saxpy_chunk(long n);

void saxpy(const float *x, float *y, float a, long n) {
    for (long start = 0; start < n; start += saxpy_chunk(n - start)) {
        long end = start + saxpy_chunk(n - start), i = start;
#if UNROLL > 1
        for (; i + UNROLL <= end; i += UNROLL)
            for (int u = 0; u < UNROLL; u++) y[i + u] = kope_axpy_one(a, x[i + u], y[i + u]);
#endif
        for (; i < end; i++) y[i] = kope_axpy_one(a, x[i], y[i]);
    }
}
"""

TESTS = """\
import numpy as np
import pytest

pytestmark = pytest.mark.kope(
    "saxpy", source=["../kernels/saxpy.c", "../kernels/util.c"], include=["../kernels/include"]
)


@pytest.fixture(scope="module", params=[1, 17, 5000], ids=lambda n: f"n{n}")
def n(request):
    return request.param


class TestSaxpy:
    def test_matches_numpy(self, kernel, n):
        rng = np.random.default_rng(0)
        x = rng.standard_normal(n).astype(np.float32)
        y0 = rng.standard_normal(n).astype(np.float32)
        y = y0.copy()
        kernel.saxpy(x, y, 2.5, n)
        np.testing.assert_allclose(y, 2.5 * x + y0, rtol=1e-5, atol=1e-6)

    def test_total(self, kernel):
        np.random.seed(7)
        x = np.ones(1000, dtype=np.float32)
        y = np.random.rand(1000).astype(np.float32)
        want = float((2.0 * x + y).astype(np.float64).sum())
        kernel.saxpy(x, y, 2.0, 1000)
        assert float(y.astype(np.float64).sum()) == pytest.approx(want, rel=1e-6)


def test_saxpy_speed(kernel, kope_bench):
    n = 1 << 21
    x = np.ones(n, dtype=np.float32)
    y = np.zeros(n, dtype=np.float32)
    kope_bench(kernel.saxpy, x, y, 0.5, n)
"""


def make_team_repo(root: Path) -> Path:
    repo = root / "team"
    (repo / "kernels" / "include").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "kernels" / "include" / "common.h").write_text(COMMON_H)
    (repo / "kernels" / "util.c").write_text(UTIL_C)
    (repo / "kernels" / "saxpy.c").write_text(SAXPY_C)
    (repo / "tests" / "test_saxpy.py").write_text(TESTS)
    (repo / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\ntestpaths = tests\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "saxpy")
    return repo


def _pytest(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args]
    return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=600)


def _report(repo: Path) -> dict[str, Any]:
    (path,) = sorted((repo / ".kope" / "runs").glob("*/report.json"))[-1:]
    report: dict[str, Any] = json.loads(path.read_text())
    return report


def test_plain_run_builds_with_headers_and_companion_sources(tmp_path):
    repo = make_team_repo(tmp_path)
    done = _pytest(repo, "-q")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "5 passed" in done.stdout, done.stdout[-2000:]


def test_team_style_repo_gets_a_verified_winner(tmp_path):
    repo = make_team_repo(tmp_path)
    head = git(repo, "rev-parse", "HEAD").strip()
    done = _pytest(repo, "--kope-optimize", "--kope-agent", "tuner", "--kope-budget", "4")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "correctness rests on fixed inputs" in out  # no test takes `rng`: said once, in red
    (op,) = _report(repo)["operators"]
    assert op["verified"] and op["branch"] == "kope/saxpy", (op["note"], op["outcomes"])
    assert set(op["fixed_input_tests"]) == {
        "tests/test_saxpy.py::TestSaxpy::test_matches_numpy[n1]",
        "tests/test_saxpy.py::TestSaxpy::test_matches_numpy[n17]",
        "tests/test_saxpy.py::TestSaxpy::test_matches_numpy[n5000]",
        "tests/test_saxpy.py::TestSaxpy::test_total",
    }
    body = git(repo, "log", "-1", "--format=%B", "kope/saxpy")
    assert "tests/test_saxpy.py: 4 passed (4 with their own fixed inputs)" in body, body
    changed = git(repo, "diff", "--name-only", head, "kope/saxpy").split()
    assert changed == ["kernels/saxpy.c"]  # the header and the companion source stay as they were
    assert git(repo, "status", "--porcelain") == "" and git(repo, "rev-parse", "HEAD").strip() == head


def test_a_rootdir_away_from_the_operators_does_not_move_the_run(tmp_path):
    """Seen with `--kope-db PATH` typed as two words: pytest took PATH's folder as rootdir, so the
    reports went there and nothing was committed, while the table said "verified". The run now finds
    the repo from the operator's source and says why; here the stray rootdir is given explicitly."""
    repo = make_team_repo(tmp_path)
    stray = tmp_path / "elsewhere"
    stray.mkdir()
    done = _pytest(
        repo,
        "tests",
        "--rootdir",
        str(stray),
        "--kope-optimize",
        "--kope-agent",
        "tuner",
        "--kope-budget",
        "2",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "does not hold the operators' sources" in out
    assert not (stray / ".kope").exists()
    (op,) = _report(repo)["operators"]
    assert op["verified"] and op["branch"] == "kope/saxpy", op


def test_doctor_reports_what_it_sees_before_any_optimizing(tmp_path):
    repo = make_team_repo(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_kope.cli", "doctor", "-p", "no:cacheprovider"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    (row,) = [line for line in out.splitlines() if line.startswith("saxpy ")]
    assert row.split()[:4] == ["saxpy", "c", "saxpy.c,", "util.c"], row
    assert "kernels/include" in row and "0 of 4" in row and row.rstrip().endswith("passes"), row
    assert "1 operator(s), 1 ready to optimize" in out
    assert not list((repo / ".kope" / "runs").glob("*/report.json"))  # checked, not optimized
    assert git(repo, "branch", "--list", "kope/*") == ""


def test_doctor_names_a_committed_kernel_that_fails(tmp_path):
    repo = make_team_repo(tmp_path)
    (repo / "kernels" / "saxpy.c").write_text(SAXPY_C.replace("kope_axpy_one(a, x[i], y[i])", "0.0f"))
    done = _pytest(repo, "--kope-check")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "incorrect: tests/test_saxpy.py::" in out and "0 ready to optimize, 1 not" in out


CMAKELISTS = """\
cmake_minimum_required(VERSION 3.16)
project(ops C)
add_library(relu SHARED src/relu.c)
target_include_directories(relu PRIVATE include)
target_link_libraries(relu m)
"""

RELU_C = """\
// kope: kernel void relu(const float *x, float *y, long n)
// kope: param PASSES = 4 | 1
// kope: flags -O0 | -O2 -march=native
// PASSES: the committed kernel writes y that many times over (a tuning knob a merge carries in the
// source; the repo's CMake passes no flags from a kope branch, so `flags` is held at -O0)
#include "relu_config.h"

void relu(const float *x, float *y, long n) {
    for (int p = 0; p < PASSES; p++)
        for (long i = 0; i < n; i++) y[i] = x[i] > RELU_FLOOR ? x[i] : RELU_FLOOR;
}
"""

RELU_TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope(
    "relu",
    source="../src/relu.c",
    root="..",
    build="cmake -S . -B build -DCMAKE_C_FLAGS={cflags} >/dev/null && cmake --build build >/dev/null",
    library="build/librelu.so",
)


@pytest.mark.parametrize("n", [1, 9, 1000])
def test_relu(kernel, rng, n):
    x = rng.standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    kernel.relu(x, y, n)
    assert_close(y, np.maximum(x, 0), rtol=0)


def test_relu_speed(kernel, rng, kope_bench):
    x = rng.standard_normal(1 << 21).astype(np.float32)
    kope_bench(kernel.relu, x, np.empty_like(x), x.size)
"""


def make_cmake_repo(root: Path) -> Path:
    repo = root / "cmakeops"
    for d in ("src", "include", "tests"):
        (repo / d).mkdir(parents=True)
    (repo / "CMakeLists.txt").write_text(CMAKELISTS)
    (repo / "include" / "relu_config.h").write_text("#define RELU_FLOOR 0.0f\n")
    (repo / "src" / "relu.c").write_text(RELU_C)
    (repo / "tests" / "test_relu.py").write_text(RELU_TESTS)
    (repo / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "relu")
    return repo


needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")


@needs_cmake
def test_cmake_built_kernel_runs_plain_and_gets_a_verified_winner(tmp_path):
    repo = make_cmake_repo(tmp_path)
    plain = _pytest(repo, "-q")
    assert plain.returncode == 0 and "4 passed" in plain.stdout, plain.stdout[-3000:] + plain.stderr[-2000:]
    done = _pytest(repo, "--kope-optimize", "--kope-agent", "tuner", "--kope-budget", "3")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    (op,) = _report(repo)["operators"]
    assert op["verified"] and op["branch"] == "kope/relu", (op["note"], op["outcomes"], op["candidates"][:2])
    assert git(repo, "diff", "--name-only", "main", "kope/relu").split() == ["src/relu.c"]
    assert not (repo / "build").exists()  # built in copies, never in the user's tree
