"""bench/large_ops, operators with large tuning spaces (issue 39): a working operator repo.

Its committed kernels pass their own tests through the plugin, and each declares a space of
600-2,000 valid points over seven or more axes, whose default is the plain kernel. Two more operators
judge those kernels at other shapes (same source, same family): siblings a graph can know the family of.
conv1d and bmm share only THREADS and flag sets with the sample operators; cdist and stencil2d share vector
length, streaming stores, threads and flag sets with them, besides axes of their own (a graph of the
sample operators knows part of their spaces, as it would a new operator's in a kernel engineer's repo).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_kope.spec import parse_spec

LARGE = Path(__file__).resolve().parent.parent / "bench" / "large_ops"
OPS = {"bmm": 720, "conv1d": 1008, "cdist": 1344, "stencil2d": 1088}
SIBLINGS = {"bmm_wide": "bmm", "conv1d_k3": "conv1d"}  # operator -> the operator whose source it judges


def test_the_large_ops_pass_through_the_plugin(pytester: pytest.Pytester):
    for name in (*OPS, *SIBLINGS):
        shutil.copytree(LARGE / name, pytester.path / name)
    for name in ("conftest.py", "pytest.ini"):
        shutil.copy(LARGE / name, pytester.path / name)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(passed=72)  # (10 + 13 correctness shapes, one timing) per kernel, twice; 11 + 11
    perf = sorted(f"{op}/test_{op}.py::test_{op}_perf *" for op in (*OPS, *SIBLINGS))
    result.stdout.fnmatch_lines(["*kope: kernel timings*", *perf])


@pytest.mark.parametrize("sibling", sorted(SIBLINGS))
def test_a_sibling_judges_another_operators_source_in_its_family(sibling: str):
    """Same source and family as the operator it copies (so the same space), its own name and shape."""
    op = SIBLINGS[sibling]
    assert marker(sibling) == (f"../{op}/{op}.c", marker(op)[1])
    assert marker(op)[0] == f"{op}.c"


def marker(op: str) -> tuple[str, str]:
    """The source and family an operator's test module gives its kope marker."""
    found = re.search(
        r'source="([^"]+)".*?family="([^"]+)"', (LARGE / op / f"test_{op}.py").read_text(), re.S
    )
    assert found, op
    return found[1], found[2]


@pytest.mark.parametrize("op", sorted(OPS))
def test_each_space_is_large_with_a_plain_default(op: str):
    spec = parse_spec((LARGE / op / f"{op}.c").read_text(), f"{op}.c")
    points = list(spec.space.points())
    assert len(points) == OPS[op] and 600 <= len(points) <= 2000
    assert len(spec.space.axes) >= 7
    defaults = spec.space.defaults
    assert defaults["flags"] == "-O2" and defaults["THREADS"] == 1 and defaults in points


@pytest.mark.parametrize("op", ["cdist", "stencil2d"])
def test_a_mixed_space_shares_some_axes_with_the_sample_operators(op: str):
    """VEC, NT and THREADS as the sample operators declare them, and most flag sets; three axes of its own."""
    samples = Path(__file__).resolve().parent.parent / "sample_ops"
    sample_axes: dict[str, set[object]] = {}
    for source in samples.glob("*/*.c"):
        for name, values in parse_spec(source.read_text(), source.name).space.axes.items():
            sample_axes.setdefault(name, set()).update(values)
    axes = parse_spec((LARGE / op / f"{op}.c").read_text(), f"{op}.c").space.axes
    for name in ("VEC", "NT", "THREADS"):
        assert set(axes[name]) <= sample_axes[name], name
    assert len(set(axes["flags"]) & sample_axes["flags"]) >= 2
    assert len([name for name in axes if name not in sample_axes]) >= 3
