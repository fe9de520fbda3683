"""What a reviewer merges is what was measured: the committed file builds the winner under the repo's
own build (a Makefile here, no pytest-kope in the loop), and flags a merge cannot carry are not searched.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from op_repos import UNJAILED, git

from pytest_kope.spec import Point
from pytest_kope.toolchains.c import CToolchain
from pytest_kope.toolchains.cdefines import BEGIN
from pytest_kope.toolchains.ownbuild import with_cflags

SAMPLE_SGEMM = Path(__file__).resolve().parent.parent / "sample_ops" / "sgemm" / "sgemm.c"


def _preprocessed(source: str, tmp: Path, *defines: str) -> str:
    (tmp / "k.c").write_text(source)
    return subprocess.run(
        ["gcc", "-E", "-P", *defines, str(tmp / "k.c")], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.parametrize("fallbacks", [True, False], ids=["own-fallback-defines", "no-fallbacks"])
def test_the_baked_file_compiles_to_the_winner_with_no_defines(tmp_path, fallbacks):
    source = SAMPLE_SGEMM.read_text()
    if not fallbacks:  # a source that relies on -D alone: its values arrive in a block ahead of the code
        source = source.replace("#ifndef MR\n#define MR 4\n#endif\n", "")
    point: Point = {
        "KERNEL": 1,
        "MR": 6,
        "NV": 2,
        "KC": 512,
        "MC": 96,
        "THREADS": 2,
        "flags": "-O3 -march=native",
    }
    baked = CToolchain().bake(source, point)
    defines = [f"-D{k}={v}" for k, v in point.items() if k != "flags"]
    assert _preprocessed(baked, tmp_path) == _preprocessed(source, tmp_path, *defines)
    assert (BEGIN in baked) == (not fallbacks)
    assert "// kope: param MR = 6 | 4 | 8" in baked  # the header's default is the winner's too
    assert CToolchain().bake(baked, point) == baked  # baking twice changes nothing
    # a -D from the command line still overrides the baked values
    assert _preprocessed(baked, tmp_path, "-DMR=8") == _preprocessed(source, tmp_path, *defines, "-DMR=8")


def test_cflags_reach_a_makefile_as_flags(tmp_path):
    (tmp_path / "Makefile").write_text('show:\n\t@echo "[$(CFLAGS)]"\n')
    for command in ('make -s CFLAGS="-fPIC {cflags}" show', "make -s CFLAGS={cflags} show"):
        run = with_cflags(command, "-O3 -march=native -DVEC=16")
        out = subprocess.run(["sh", "-c", run], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert out.stdout.strip() in ("[-fPIC -O3 -march=native -DVEC=16]", "[-O3 -march=native -DVEC=16]")


COLSUM_C = """\
// kope: kernel void colsum(const float *x, float *y, int rows, int cols)
// kope: param ORDER = 0 | 1
// kope: flags -O2 | -O3 -march=native
// ORDER 0 walks each column down the rows (a stride of a row per load); ORDER 1 adds rows into y
// in memory order. Both add each column's values in the same order, so they agree bit for bit.
#include "colsum.h"

#ifndef ORDER
#define ORDER 0
#endif

void colsum(const float *x, float *y, int rows, int cols) {
#if ORDER == 0
    for (int c = 0; c < cols; c++) {
        float s = 0.0f;
        for (int r = 0; r < rows; r++)
            s += x[(long)r * cols + c];
        y[c] = s;
    }
#else
    for (int c = 0; c < cols; c++)
        y[c] = 0.0f;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            y[c] += x[(long)r * cols + c];
#endif
}
"""

MAKEFILE = """\
CFLAGS ?= -O2
lib/libcolsum.so: kernels/colsum.c kernels/include/colsum.h
\tmkdir -p lib && $(CC) $(CFLAGS) -fPIC -shared -Ikernels/include -o $@ kernels/colsum.c
"""

COLSUM_TESTS = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("colsum", source="../kernels/colsum.c", root="..",
                              build='make -s CFLAGS="{cflags}"', library="lib/libcolsum.so")


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (64, 33), (129, 500)])
def test_colsum(kernel, rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = np.empty(cols, dtype=np.float32)
    kernel.colsum(x, y, rows, cols)
    assert_close(y, x.astype(np.float64).sum(axis=0), rtol=1e-5)


def test_colsum_speed(kernel, rng, kope_bench):
    x = rng.standard_normal((2048, 2048)).astype(np.float32)
    kope_bench(kernel.colsum, x, np.empty(2048, dtype=np.float32), 2048, 2048)
"""


def _make_repo(root: Path) -> Path:
    repo = root / "makeops"
    (repo / "kernels" / "include").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "kernels" / "colsum.c").write_text(COLSUM_C)
    (repo / "kernels" / "include" / "colsum.h").write_text("void colsum(const float *, float *, int, int);\n")
    (repo / "Makefile").write_text(MAKEFILE)
    (repo / "tests" / "test_colsum.py").write_text(COLSUM_TESTS)
    (repo / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\nkope_include = kernels/include\n")
    (repo / ".gitignore").write_text("lib/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "colsum")
    return repo


def _built_by_make(repo: Path, ref: str, where: Path) -> ctypes.CDLL:
    """`ref`'s tree built by its own Makefile, as a user would after the merge: no pytest-kope."""
    where.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    subprocess.run(["make", "-s"], cwd=where, check=True, capture_output=True)
    return ctypes.CDLL(str(where / "lib" / "libcolsum.so"))


def _paired_ratio(before: ctypes.CDLL, after: ctypes.CDLL, rounds: int = 15) -> float:
    """Median of per-round (before / after) times, the two builds interleaved: a plain harness."""
    x = np.random.default_rng().standard_normal((2048, 2048)).astype(np.float32)
    y = np.empty(2048, dtype=np.float32)
    args = (x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), 2048, 2048)

    def once(lib: ctypes.CDLL) -> float:
        t0 = time.perf_counter()
        lib.colsum(*args)
        return time.perf_counter() - t0

    once(before), once(after)
    return statistics.median(once(before) / once(after) for _ in range(rounds))


@pytest.mark.skipif(
    subprocess.run(["make", "--version"], capture_output=True).returncode != 0, reason="no make"
)
def test_a_makefile_repo_gets_the_winner_from_its_own_build_after_the_merge(tmp_path):
    repo = _make_repo(tmp_path)
    cmd = [sys.executable, "-m", "pytest", "--kope-optimize", "--kope-agent", "tuner", "--kope-budget", "4"]
    done = subprocess.run([*cmd, *UNJAILED], cwd=repo, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "compiler flags carried in the source for gcc" in out  # `flags` searched as source forms
    diff = git(repo, "diff", "main", "kope/colsum", "--", "kernels/colsum.c")
    assert "+#define ORDER 1" in diff, diff
    assert "// kope: flags -O2 | -O3 -march=native" in git(repo, "show", "kope/colsum:kernels/colsum.c")
    before = _built_by_make(repo, "main", tmp_path / "main")
    after = _built_by_make(repo, "kope/colsum", tmp_path / "merged")
    ratio = _paired_ratio(before, after)
    reported = float(
        git(repo, "log", "-1", "--format=%(trailers:key=Kope-Speedup,valueonly)", "kope/colsum")
        .strip()
        .rstrip("x")
    )
    # one set of numbers: the report's times divide to its speedup, which the commit states
    (op,) = json.loads(next((repo / ".kope" / "runs").glob("*/report.json")).read_text())["operators"]
    assert op["speedup"] == pytest.approx(op["baseline_s"] / op["best_s"], rel=1e-9)
    assert f"{op['speedup']:.2f}" == f"{reported:.2f}"
    body = git(repo, "log", "-1", "--format=%B", "kope/colsum")
    assert "- tests/test_colsum.py: 4 passed" in body, body
    print(f"plain-harness ratio after the merge {ratio:.2f}x, reported {reported:.2f}x")
    assert ratio > 1.5 and reported > 1.5, (ratio, reported)
