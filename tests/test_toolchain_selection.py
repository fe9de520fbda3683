"""Selecting a toolchain once for a repo: `--kope-toolchain NAME` and ini `kope_toolchain`.

Real pytest runs (pytester) over a tiny repo with one Triton and one C operator; what a test sees as
its operator's toolchain is what a build and a judging child would use. No triton is needed: the
toolchain is decided at collection, from the marker and the suffix.
"""

from __future__ import annotations

import re

import pytest

from pytest_kope.toolchains import devices

TEST = """
import pytest

@pytest.mark.kope("k", source="k.py")
def test_triton_op(kope_operator):
    print("TOOLCHAIN", kope_operator.name, kope_operator.toolchain)

@pytest.mark.kope("pinned", source="k.py", toolchain="triton")
def test_pinned_op(kope_operator):
    print("TOOLCHAIN", kope_operator.name, kope_operator.toolchain)

@pytest.mark.kope("c_op", source="c_op.c")
def test_c_op(kope_operator):
    print("TOOLCHAIN", kope_operator.name, kope_operator.toolchain)
"""


@pytest.fixture
def repo(pytester: pytest.Pytester):
    pytester.makepyfile(test_ops=TEST)
    (pytester.path / "k.py").write_text("# kope: kernel k(x: in, y: out, n)\ndef k(x, y, n):\n    pass\n")
    (pytester.path / "c_op.c").write_text("// kope: kernel void c_op(const float *x, float *y, long n)\n")
    return pytester


def toolchains(result: pytest.RunResult) -> dict[str, str]:
    return dict(re.findall(r"TOOLCHAIN (\S+) (\S+)", result.stdout.str()))


def test_by_suffix_by_default(repo):
    result = repo.runpytest("-s", "-p", "no:cacheprovider")
    assert toolchains(result) == {"k": "triton", "pinned": "triton", "c_op": "c"}


def test_the_option_moves_every_operator_of_its_suffix(repo):
    result = repo.runpytest("-s", "-p", "no:cacheprovider", "--kope-toolchain", "triton-ascend")
    assert toolchains(result) == {
        "k": "triton-ascend",
        "pinned": "triton",
        "c_op": "c",
    }  # a marker's own wins
    result.stdout.no_fnmatch_line("*kope: k, pinned run on toolchain*")  # `k` moved; `pinned` may be named


def test_the_ini_option_does_the_same(repo):
    repo.makeini("[pytest]\nkope_toolchain = triton-ascend\n")
    assert toolchains(repo.runpytest("-s", "-p", "no:cacheprovider"))["k"] == "triton-ascend"


def test_judging_children_get_it_from_the_environment(repo, monkeypatch):
    monkeypatch.setenv("KOPE_TOOLCHAIN", "triton-ascend")
    assert toolchains(repo.runpytest("-s", "-p", "no:cacheprovider"))["k"] == "triton-ascend"


def test_an_unknown_name_is_a_usage_error(repo):
    result = repo.runpytest("-p", "no:cacheprovider", "--kope-toolchain", "tritonn")
    result.stderr.fnmatch_lines(["*--kope-toolchain tritonn: no toolchain of that name (known: c, triton, *"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_plain_triton_where_triton_ascend_is_installed_is_said_in_one_line(repo):
    result = repo.runpytest("-p", "no:cacheprovider")
    line = "kope: k, pinned run on toolchain 'triton', but the installed triton is triton-ascend: no Ascend*"
    if devices.triton_flavour() == "ascend":
        result.stdout.fnmatch_lines([line + "select it with --kope-toolchain triton-ascend*"])
    else:  # community triton (or none): nothing to say
        result.stdout.no_fnmatch_line(line)


def test_the_option_is_in_help(pytester: pytest.Pytester):
    pytester.runpytest("--help").stdout.fnmatch_lines(["*--kope-toolchain=NAME*"])
