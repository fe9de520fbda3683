"""The marker's `flops=`: its fixed grammar, and the FMA bound it sets on timed calls end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from op_repos import UNJAILED, git, make_op_repo

from pytest_kope.flops import ALL, FlopsError, count_flops, flops_error, parse_flops


@pytest.mark.parametrize(
    "expr, values, expected",
    [
        ("2*M*N*K", {"M": 1024, "N": 1024, "K": 1024}, 2 * 1024**3),
        ("rows*(cols-1)", {"rows": 3, "cols": 5}, 12),
        ("n // 2 + n / 4 - -1", {"n": 8}, 4 + 2 + 1),
        (" 3 ", {}, 3),
    ],
)
def test_valid_expressions_count_from_the_calls_integer_arguments(expr, values, expected):
    exprs = parse_flops(expr, "t.py::x")
    assert exprs == {ALL: expr}
    assert count_flops(exprs, "any", {**values, "x": np.zeros(3)}, "t.py::x") == expected


@pytest.mark.parametrize(
    "expr, found",
    [
        ("__import__('os').system('true')", "\"__import__('os').system('true')\", which is not a name"),
        ("__class__", "the name __class__"),
        ("M ** 2", "'M ** 2', which is not a name"),
        ("M << 2", "'M << 2', which is not a name"),
        ("M % 2", "'M % 2', which is not a name"),
        ("M.bit_length()", "'M.bit_length()', which is not a name"),
        ("M if N else K", "'M if N else K', which is not a name"),
        ("[M][0]", "'[M][0]', which is not a name"),
        ("1.5 * M", "the constant 1.5 (integers only)"),
        ("True * M", "the constant True (integers only)"),
        ("'M' * 3", "the constant 'M' (integers only)"),
        ("M *", "a syntax error"),
        ("", "a syntax error"),
        ("M +" + " M +" * 100 + " M", "longer than 200 characters"),
    ],
)
def test_anything_outside_the_grammar_is_a_one_line_error_and_never_run(expr, found):
    why = flops_error(expr)
    assert why.startswith("flops= takes an arithmetic expression") and found in why and "\n" not in why
    with pytest.raises(FlopsError, match=r"^ops/test_mm\.py::t: pytest\.mark\.kope\(flops=.*fix the marker$"):
        parse_flops(expr, "ops/test_mm.py::t")


def test_the_per_function_form_and_what_is_not_a_count():
    exprs = parse_flops({"qk": "2*S*S*D", "pv": "2*S*S*D"}, "t.py::x")
    assert count_flops(exprs, "qk", {"S": 4, "D": 8}, "t.py::x") == 256
    assert count_flops(exprs, "softmax", {"S": 4}, "t.py::x") == 0.0  # none declared for it
    assert parse_flops(None, "t.py::x") == {}
    for junk in (3, ["2*M"], {}, {"qk": 3}):
        with pytest.raises(FlopsError, match=r"^t\.py::x: pytest\.mark\.kope\(flops=\.\.\.\)"):
            parse_flops(junk, "t.py::x")


def test_a_name_the_call_does_not_pass_as_an_integer_says_which_and_what_it_has():
    exprs = parse_flops("2*M*N*Q", "t.py::x")
    with pytest.raises(FlopsError) as e:
        count_flops(exprs, "sgemm", {"M": 2, "N": 3, "A": np.zeros(2), "flag": True, "f": 1.0}, "t.py::x")
    assert str(e.value) == (
        "t.py::x: pytest.mark.kope(flops='2*M*N*Q') reads Q, which sgemm() does not take as an integer"
        " argument (its integer arguments: M, N); fix the marker"
    )
    assert count_flops(exprs, "f", {"M": np.int32(2), "N": np.int64(3), "Q": 4}, "t") == 48
    with pytest.raises(FlopsError, match="cannot be evaluated: integer division"):
        count_flops(parse_flops("M // N", "t"), "f", {"M": 1, "N": 0}, "t")


MM_C = """\
// kope: kernel void mm(const float *A, const float *B, float *C, int M, int N, int K)
// kope: flags -O0 | -O2 -march=native
void mm(const float *A, const float *B, float *C, int M, int N, int K) {
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) C[i * N + j] = 0.0f;
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) C[i * N + j] += A[i * K + k] * B[k * N + j];
    }
}
"""

MM_TEST = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("mm", source="mm.c", flops=FLOPS)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 5, 7), (33, 17, 65)])
def test_mm(kernel, rng, m, n, k):
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), dtype=np.float32)
    kernel.mm(a, b, c, m, n, k)
    assert_close(c, (a.astype(np.float64) @ b).astype(np.float32), rtol=1e-5)


def test_mm_speed(kernel, kope_bench, rng):
    m = n = k = 160
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), dtype=np.float32)
    kope_bench(kernel.mm, a, b, c, m, n, k)
"""


def optimize(root: Path, flops: str) -> tuple[dict[str, Any], str, str]:
    """One tuner run (its only other point: -O2) on an mm repo whose marker declares `flops`."""
    make_op_repo(root, MM_C, MM_TEST.replace("FLOPS", repr(flops)), name="mm")
    cmd = [sys.executable, "-m", "pytest", "--kope-optimize", "--kope-agent=tuner", "--kope-budget", "1"]
    proc = subprocess.run(
        [*cmd, "--kope-timeout", "60", "-p", "no:cacheprovider", *UNJAILED],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    report = json.loads(next((root / ".kope" / "runs").glob("*/report.json")).read_text())
    branches = git(root, "for-each-ref", "--format=%(refname:short)", "refs/heads/kope/")
    return report["operators"][0], branches, output


@pytest.fixture(scope="module")
def inflated(tmp_path_factory):
    return optimize(tmp_path_factory.mktemp("inflated"), "2*M*N*K*100000")


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    return optimize(tmp_path_factory.mktemp("declared"), "2*M*N*K")


def test_an_honest_kernel_timed_beyond_its_declared_flops_is_suspect_and_never_crowned(inflated):
    op, branches, output = inflated
    (candidate,) = [c for c in op["candidates"] if "-O2" in c["idea"]]
    assert candidate["outcome"] == "suspect", candidate
    why = candidate["reason"]
    assert "faster than physics allows" in why and "FLOPs beyond the peak" in why, candidate
    assert not op["verified"] and branches == ""
    # the committed kernel is as impossible: the run says where to look
    assert "the committed kernel itself times faster than physics allows" in output
    assert "check the marker's flops=" in output


def test_the_same_kernel_with_its_true_count_is_crowned(declared):
    op, branches, output = declared
    (candidate,) = [c for c in op["candidates"] if "-O2" in c["idea"]]
    assert candidate["outcome"] == "better", candidate
    assert op["verified"] and branches.split() == ["kope/mm"], output[-2000:]
    assert "faster than physics" not in output


def test_a_marker_outside_the_grammar_stops_a_plain_run_and_runs_nothing(tmp_path):
    evil = "__import__('os').system('touch pwned')"
    make_op_repo(tmp_path, MM_C, MM_TEST.replace("FLOPS", repr(evil)), name="mm")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and not (tmp_path / "pwned").exists()
    assert "mm/test_mm.py::test_mm" in proc.stdout + proc.stderr
    assert "which is not a name, an integer or one of + - * / //" in proc.stdout + proc.stderr
