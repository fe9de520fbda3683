"""bench/large_ops, operators with large tuning spaces (issue 39): a working operator repo.

Its committed kernels pass their own tests through the plugin, and each declares a space of
600-2,000 valid points over seven or more axes, whose default is the plain kernel.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_kope.spec import parse_spec

LARGE = Path(__file__).resolve().parent.parent / "bench" / "large_ops"
OPS = {"bmm": 720, "conv1d": 1008}


def test_the_large_ops_pass_through_the_plugin(pytester: pytest.Pytester):
    for name in OPS:
        shutil.copytree(LARGE / name, pytester.path / name)
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(LARGE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(passed=25)  # 10 + 13 correctness shapes, and one timing per operator
    result.stdout.fnmatch_lines(
        ["*kope: kernel timings*", *[f"{op}/test_{op}.py::test_{op}_perf *" for op in OPS]]
    )


@pytest.mark.parametrize("op", sorted(OPS))
def test_each_space_is_large_with_a_plain_default(op: str):
    spec = parse_spec((LARGE / op / f"{op}.c").read_text(), f"{op}.c")
    points = list(spec.space.points())
    assert len(points) == OPS[op] and 600 <= len(points) <= 2000
    assert len(spec.space.axes) >= 7
    defaults = spec.space.defaults
    assert defaults["flags"] == "-O2" and defaults["THREADS"] == 1 and defaults in points
