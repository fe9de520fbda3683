"""bench/unseen_ops, the operators the sample graph has never seen: a working operator repo.

Its committed kernels pass their own tests through the plugin, and each declares a space of the
sample operators' size whose default is the plain kernel (what a cold/warm transfer bench starts from).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_kope.spec import parse_spec

UNSEEN = Path(__file__).resolve().parent.parent / "bench" / "unseen_ops"
OPS = ["addlayernorm", "cumsum", "l2norm", "leakyrelu", "logsoftmax", "matvec"]


def test_the_unseen_ops_pass_through_the_plugin(pytester: pytest.Pytester):
    for name in OPS:
        shutil.copytree(UNSEEN / name, pytester.path / name)
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(UNSEEN / name, pytester.path / name)
    # a subprocess: the suite has imported test modules of other repos with the same rootdir-relative names
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(passed=61 + len(OPS))  # the correctness shapes, and one timing per operator
    result.stdout.fnmatch_lines(
        ["*kope: kernel timings*", *[f"{op}/test_{op}.py::test_{op}_perf *" for op in OPS]]
    )


@pytest.mark.parametrize("op", OPS)
def test_each_space_is_sample_sized_with_a_plain_default(op: str):
    spec = parse_spec((UNSEEN / op / f"{op}.c").read_text(), f"{op}.c")
    points = list(spec.space.points())
    assert 50 <= len(points) <= 200, f"{op}: {len(points)} points"
    defaults = spec.space.defaults
    assert defaults["flags"] == "-O2" and defaults["THREADS"] == 1 and defaults.get("VEC", 0) == 0
    assert defaults in points and len({str(sorted(p.items())) for p in points}) == len(points)
