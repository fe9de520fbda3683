"""Flags in the source under a repo's own make, against flags on pytest-kope's command line (issue 53).

A realistic operator repo that builds its kernels with its own Makefile (`CFLAGS ?= -O2 -fPIC
-fopenmp`, tests apart from kernels, OpenMP kernels with a tuning parameter and a `flags` axis) is
optimized twice by the tuner, same seed and budget:

- own build: the tests' markers name the Makefile (`build='make -s CFLAGS="-fPIC -fopenmp {cflags}"'`),
  so each `flags` value is searched as pragmas and target clones written into the source, and the
  winner is committed that way;
- pytest-kope's build: the same repo without the Makefile and `build=`, so flags go on gcc's command
  line (as for any repo pytest-kope builds).

Then, in this process, interleaved rounds on the same buffers: main's library built by `make`, the
own-build branch's built by `make` (no pytest-kope, no flags given), and pytest-kope's winner built as
pytest-kope builds it. Reported per operator: the verified speedup each run claims (with its 95%
bound), the speedup `make` delivers from the branch (median of per-round ratios against main's, with
its 95% interval), the same for pytest-kope's build, and their ratio: the share of pytest-kope's
speedup that the repo's own make reaches (goal: at least 80%). And the fallback: the branch built by `make` with
`-march=x86-64 -DKOPE_NO_CLONES` must export no clones and compute what main computes.

    python bench/ownbuild_flags.py [--ops row_max,poly] [--budget 9] [--rounds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before libgomp loads: as the judge times

import numpy as np  # noqa: E402
from tabulate import tabulate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kope.hardware import cpu_fingerprint  # noqa: E402
from pytest_kope.judge.measure.stats import median_ci  # noqa: E402
from pytest_kope.toolchains.flagblock import dispatches  # noqa: E402

MAKEFILE = """\
CFLAGS ?= -O2 -fPIC -fopenmp
OPS := $(patsubst kernels/%.c,%,$(wildcard kernels/*.c))
all: $(OPS:%=lib/lib%.so)
lib/lib%.so: kernels/%.c
\tmkdir -p lib && $(CC) $(CFLAGS) -shared -o $@ $< -lm
"""

KERNELS = {
    "row_max": """\
// kope: kernel void row_max(const float *x, float *y, int rows, int cols)
// kope: param VEC = 1 | 8 | 16
// kope: flags -O2 | -O3 | -O3 -march=native
#include <float.h>

#ifndef VEC
#define VEC 1
#endif

void row_max(const float *x, float *y, int rows, int cols) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *row = x + (long)r * cols;
        float m[VEC];
        for (int v = 0; v < VEC; v++) m[v] = -FLT_MAX;
        int c = 0;
        for (; c + VEC <= cols; c += VEC)
            for (int v = 0; v < VEC; v++) m[v] = row[c + v] > m[v] ? row[c + v] : m[v];
        float best = -FLT_MAX;
        for (int v = 0; v < VEC; v++) best = m[v] > best ? m[v] : best;
        for (; c < cols; c++) best = row[c] > best ? row[c] : best;
        y[r] = best;
    }
}
""",
    "poly": """\
// kope: kernel void poly(const float *x, float *y, int n)
// kope: param CHUNK = 1024 | 16384
// kope: flags -O2 | -O3 | -O3 -march=native
// A degree-16 polynomial by Horner's rule, in chunks shared out to OpenMP threads.
#define H(c) p = p * v + (c);

#ifndef CHUNK
#define CHUNK 1024
#endif

void poly(const float *x, float *y, int n) {
#pragma omp parallel for schedule(static)
    for (int start = 0; start < n; start += CHUNK) {
        int end = start + CHUNK < n ? start + CHUNK : n;
        for (int i = start; i < end; i++) {
            float v = x[i], p = 1.0f;
            H(0.5f) H(0.25f) H(0.125f) H(0.0625f) H(0.5f) H(0.25f) H(0.125f) H(0.0625f)
            H(0.5f) H(0.25f) H(0.125f) H(0.0625f) H(0.5f) H(0.25f) H(0.125f) H(0.0625f)
            y[i] = p;
        }
    }
}
""",
}

TESTS = {
    "row_max": """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("row_max", source="../kernels/row_max.c"{build})


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (33, 100), (64, 4099)])
def test_row_max(kernel, rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    y = np.empty(rows, dtype=np.float32)
    kernel.row_max(x, y, rows, cols)
    assert_close(y, x.max(axis=1), rtol=0)


def test_row_max_speed(kernel, rng, kope_bench):
    x = rng.standard_normal((2048, 4096)).astype(np.float32)
    kope_bench(kernel.row_max, x, np.empty(2048, dtype=np.float32), 2048, 4096)
""",
    "poly": """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("poly", source="../kernels/poly.c"{build})


def reference(x):
    v, p = x.astype(np.float64), np.ones(x.size)
    for c in [0.5, 0.25, 0.125, 0.0625] * 4:
        p = p * v + c
    return p


@pytest.mark.parametrize("n", [1, 7, 1000, 70001])
def test_poly(kernel, rng, n):
    x = rng.uniform(-1, 1, n).astype(np.float32)
    y = np.empty_like(x)
    kernel.poly(x, y, n)
    assert_close(y, reference(x), rtol=1e-5)


def test_poly_speed(kernel, rng, kope_bench):
    x = rng.uniform(-1, 1, 1 << 22).astype(np.float32)
    kope_bench(kernel.poly, x, np.empty_like(x), x.size)
""",
}
MARKER = ', root="..", build=\'make -s CFLAGS="-fPIC -fopenmp {cflags}"\', library="lib/lib%s.so"'


def git(cwd: Path, *args: str) -> str:
    run = ["git", "-c", "user.email=bench@example.com", "-c", "user.name=bench", *args]
    return subprocess.run(run, cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(where: Path, ops: list[str], own: bool) -> Path:
    """The operator repo: with its Makefile and `build=` markers (own), or without (pytest-kope builds)."""
    (where / "kernels").mkdir(parents=True)
    (where / "tests").mkdir()
    for op in ops:
        (where / "kernels" / f"{op}.c").write_text(KERNELS[op])
        build = MARKER.replace("%s", op) if own else ""
        (where / "tests" / f"test_{op}.py").write_text(TESTS[op].replace("{build}", build))
    if own:
        (where / "Makefile").write_text(MAKEFILE)
    (where / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\ntestpaths = tests\n")
    (where / ".gitignore").write_text("lib/\n")
    git(where, "init", "-q", "-b", "main")
    git(where, "add", "-A")
    git(where, "commit", "-qm", "kernels")
    return where


def optimize(repo: Path, budget: int, seed: int) -> dict[str, dict[str, Any]]:
    """A tuner run; each operator's report entry by name."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider", "--kope-optimize"]
    cmd += ["--kope-agent", "tuner", "--kope-budget", str(budget), "--kope-seed", str(seed)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"optimize run in {repo} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    report = json.loads(sorted((repo / ".kope" / "runs").glob("*/report.json"))[-1].read_text())
    return {op["name"]: op for op in report["operators"]}


def checkout(repo: Path, ref: str, where: Path) -> Path:
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def make(tree: Path, op: str, *cflags: str) -> Path:
    """`make` in `tree`, as the repo's user runs it (`cflags`: a CFLAGS given on its command line)."""
    args = [f"CFLAGS={' '.join(cflags)}"] if cflags else []
    subprocess.run(["make", "-s", f"lib/lib{op}.so", *args], cwd=tree, check=True, capture_output=True)
    return tree / "lib" / f"lib{op}.so"


def kope_build(source: Path, flags: str, out: Path) -> Path:
    """The winner built as pytest-kope builds it (toolchains/c.py: flags on gcc's command line)."""
    base = ["gcc", "-shared", "-fPIC", "-fopenmp", "-std=gnu11", *flags.split()]
    subprocess.run([*base, str(source), "-o", str(out), "-lm"], check=True, capture_output=True)
    return out


def case(op: str) -> tuple[tuple[Any, ...], np.ndarray, np.ndarray]:
    """Arguments of one timed call (buffers larger than the last-level cache), its output and input."""
    rng = np.random.default_rng(7)
    if op == "row_max":
        x = rng.standard_normal((4096, 4096)).astype(np.float32)
        y = np.empty(4096, dtype=np.float32)
        return (x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), 4096, 4096), y, x
    x = rng.uniform(-1, 1, 1 << 24).astype(np.float32)
    y = np.empty_like(x)
    return (x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), x.size), y, x


def interleaved(libs: dict[str, Path], op: str, rounds: int) -> dict[str, tuple[float, float, float]]:
    """Each library's speedup over "main" (median of per-round ratios, 95% interval), the libraries
    called in turn on the same buffers in every round."""
    args, _, _ = case(op)
    fns = {name: getattr(ctypes.CDLL(str(path)), op) for name, path in libs.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn(*args)
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(*args)
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name in fns:
        ratios = sorted(b / a for b, a in zip(times["main"], times[name]))
        low, high = median_ci(ratios)
        out[name] = (ratios[len(ratios) // 2], low, high)
    return out


def same_results(a: Path, b: Path, op: str) -> bool:
    args, y, _ = case(op)
    outs = []
    for lib in (a, b):
        y.fill(np.nan)
        getattr(ctypes.CDLL(str(lib)), op)(*args)
        outs.append(y.astype(np.float64).copy())
    scale = float(np.max(np.abs(outs[0]))) or 1.0
    return bool(np.all(np.isfinite(outs[1]))) and float(np.max(np.abs(outs[0] - outs[1]))) <= 1e-5 * scale


def measure(ops: list[str], budget: int, rounds: int, seed: int, work: Path) -> list[dict[str, Any]]:
    own_repo = make_repo(work / "own" / "repo", ops, own=True)
    kope_repo = make_repo(work / "kope" / "repo", ops, own=False)
    own, kope = optimize(own_repo, budget, seed), optimize(kope_repo, budget, seed)
    rows = []
    for op in ops:
        row: dict[str, Any] = {
            "operator": op,
            "own": _claim(own[op], own_repo),
            "kope": _claim(kope[op], kope_repo),
        }
        main_tree = checkout(own_repo, "main", work / "trees" / f"{op}-main")
        libs = {"main": make(main_tree, op)}
        if own[op]["verified"]:
            branch = checkout(own_repo, own[op]["branch"], work / "trees" / f"{op}-own")
            libs["own make"] = make(branch, op)
            held = make(
                checkout(own_repo, own[op]["branch"], work / "trees" / f"{op}-held"),
                op,
                "-O2 -fPIC -fopenmp -march=x86-64 -DKOPE_NO_CLONES",
            )
            row["fallback"] = {
                "dispatches": dispatches(held),
                "clones on the branch": dispatches(libs["own make"]),
                "same results as main": same_results(libs["main"], held, op),
            }
        if kope[op]["verified"]:
            source = (
                checkout(kope_repo, kope[op]["branch"], work / "trees" / f"{op}-kope") / "kernels" / f"{op}.c"
            )
            flags = str(kope[op]["best"]["params"].get("flags", "-O2"))
            libs["pytest-kope build"] = kope_build(source, flags, source.with_suffix(".so"))
        row["delivered"] = interleaved(libs, op, rounds)
        rows.append(row)
    return rows


def _claim(op: dict[str, Any], repo: Path) -> dict[str, Any]:
    """What a run claims for an operator: its verified speedup, with the 95% bound its commit states."""
    best = op.get("best") or {}
    body = git(repo, "log", "-1", "--format=%B", op["branch"]) if op.get("branch") else ""
    bound = re.search(r"\d+\.\d+x \[(\d+\.\d+), (\d+\.\d+)\]", body)
    return {
        "verified": bool(op["verified"]),
        "speedup": op.get("speedup"),
        "bound": [float(bound.group(1)), float(bound.group(2))] if bound else None,
        "params": best.get("params"),
        "flags_in_source": op.get("flags_in_source"),
        "note": op.get("note"),
    }


def _fig(got: dict[str, tuple[float, float, float]], name: str) -> str:
    if name not in got:
        return "-"
    m, lo, hi = got[name]
    return f"{m:.2f}x [{lo:.2f}, {hi:.2f}]"


def _claimed(claim: dict[str, Any]) -> str:
    if not claim["verified"]:
        return "not verified"
    bound = claim["bound"]
    return f"{claim['speedup']:.2f}x" + (f" [{bound[0]:.2f}, {bound[1]:.2f}]" if bound else "")


def table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        got = r["delivered"]
        share = (
            f"{got['own make'][0] / got['pytest-kope build'][0]:.0%}"
            if "own make" in got and "pytest-kope build" in got
            else "-"
        )
        fb = r.get("fallback") or {}
        lines.append(
            [
                r["operator"],
                _claimed(r["own"]),
                _fig(got, "own make"),
                _claimed(r["kope"]),
                _fig(got, "pytest-kope build"),
                share,
                ("ok" if fb and not fb["dispatches"] and fb["same results as main"] else "FAILED")
                if fb
                else "-",
            ]
        )
    headers = [
        "operator",
        "verified (own build)",
        "make on kope/ branch",
        "verified (pytest-kope build)",
        "pytest-kope build",
        "own make / pytest-kope build",
        "fallback",
    ]
    return tabulate(lines, headers=headers, tablefmt="github", disable_numparse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="row_max,poly")
    ap.add_argument("--budget", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "ownbuild_flags.json")
    a = ap.parse_args()
    ops = [o for o in a.ops.split(",") if o]
    unknown = [o for o in ops if o not in KERNELS]
    if unknown:
        raise SystemExit(f"--ops: unknown operator(s) {unknown}; choose from {sorted(KERNELS)}")
    if shutil.which("make") is None:
        raise SystemExit("this bench needs make (apt-get install make)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kope-ownbuild-") as tmp:
        rows = measure(ops, a.budget, a.rounds, a.seed, Path(tmp))
    print(table(rows))
    print(
        "speedups over main's library built by make; [95% interval of the median per-round ratio];"
        " own make / pytest-kope build: the share of pytest-kope's speedup the repo's make reaches, goal >= 80%"
    )
    a.json.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "hardware": cpu_fingerprint(),
        "budget": a.budget,
        "rounds": a.rounds,
        "seed": a.seed,
        "seconds": round(time.monotonic() - started, 1),
        "operators": rows,
    }
    a.json.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
