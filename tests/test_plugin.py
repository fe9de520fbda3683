"""The plugin in plain runs: the marker, the fixtures, the oracle guards, build errors, -k/-x/xdist."""

from __future__ import annotations

import pytest
from op_repos import SCALE_C, make_op_repo


def test_right_kernel_passes_and_times_are_printed(pytester: pytest.Pytester, op_repo) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["*kope: kernel timings*", "*test_scale_speed*[mu]s*"])


def test_wrong_kernel_fails_naming_operator_and_values(pytester: pytest.Pytester) -> None:
    make_op_repo(pytester.path, SCALE_C.replace("2.0f * x[i]", "2.001f * x[i]"), commit=False)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=4)  # UNROLL=1 loop is the wrong one; the perf test still runs
    result.stdout.fnmatch_lines(
        ["*output: max error*", "*kope*", "operator 'scale' failed with kernel */scale/scale.c"]
    )


def test_unwritten_output_is_caught_by_the_guard(pytester: pytest.Pytester) -> None:
    lazy = SCALE_C.replace(
        "for (; i < n; i++) y[i] = 2.0f * x[i];", "for (; i < n - 1; i++) y[i] = 2.0f * x[i];"
    )
    make_op_repo(pytester.path, lazy, commit=False)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "matches")
    result.stdout.fnmatch_lines(
        ["*GuardViolation: kernel scale() left 1 of * elements of output 'y' unwritten*"]
    )


def test_input_mutation_is_caught(pytester: pytest.Pytester) -> None:
    sneaky = SCALE_C.replace("const float *x", "float *x").replace(
        "for (; i < n; i++) y[i] = 2.0f * x[i];", "for (; i < n; i++) { y[i] = 2.0f * x[i]; x[i] = 0; }"
    )
    sneaky = sneaky.replace("void scale(float *x", "void scale(const float *x").replace(
        "x[i] = 0;", "((float *)x)[i] = 0;"
    )
    make_op_repo(pytester.path, sneaky, commit=False)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "matches")
    result.stdout.fnmatch_lines(["*modified input 'x'*"])


def test_build_error_names_operator_and_file(pytester: pytest.Pytester) -> None:
    make_op_repo(
        pytester.path, SCALE_C.replace("y[i] = 2.0f * x[i];\n}", "y[i] = 2.0f * x[i]\n}"), commit=False
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*kope: operator scale: build of */scale/scale.c failed:*", "*error: expected*"]
    )


def test_missing_source_is_a_one_line_usage_error(pytester: pytest.Pytester) -> None:
    make_op_repo(pytester.path, commit=False)
    (pytester.path / "scale" / "scale.c").unlink()
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*kernel source */scale.c of operator 'scale' does not exist; fix source=*"])


@pytest.mark.parametrize(
    "option, given",
    [("--kope-timing-seconds", "0"), ("--kope-timing-seconds", "nope"), ("--kope-explore", "1.5")],
)
def test_a_setting_out_of_range_is_a_one_line_usage_error(
    pytester: pytest.Pytester, op_repo, option: str, given: str
) -> None:
    result = pytester.runpytest("--kope-optimize", option, given, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}*"])


def test_a_share_in_the_ini_file_that_is_no_number_is_a_usage_error(pytester: pytest.Pytester, op_repo) -> None:
    """An ini value is text: `Settings.from_config` reads it and names the option, once."""
    ini = pytester.path / "pytest.ini"
    ini.write_text(ini.read_text() + "kope_explore = lots\n")
    result = pytester.runpytest("--kope-optimize", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kope-explore takes a share between 0 and 1, got 'lots'*"])


def test_selection_with_k_and_x(pytester: pytest.Pytester, op_repo) -> None:
    pytester.runpytest("-p", "no:cacheprovider", "-k", "matches and 7").assert_outcomes(passed=1)
    broken = SCALE_C.replace("2.0f * x[i];\n}", "3.0f * x[i];\n}")
    (pytester.path / "scale" / "scale.c").write_text(broken)
    pytester.runpytest("-p", "no:cacheprovider", "-x").assert_outcomes(failed=1)


def test_under_xdist(pytester: pytest.Pytester, op_repo) -> None:
    pytest.importorskip("xdist")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "2")
    result.assert_outcomes(passed=5)


def test_seed_is_shown_and_replayable(pytester: pytest.Pytester, op_repo) -> None:
    result = pytester.runpytest("-p", "no:cacheprovider", "--kope-seed", "1234", "-k", "matches")
    result.stdout.fnmatch_lines(["kope: rng seed 1234 (replay with --kope-seed 1234)"])


def test_plain_tests_without_marker_are_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    assert 1 + 1 == 2\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not (pytester.path / ".kope").exists()


def test_kope_state_ignores_itself(pytester: pytest.Pytester, op_repo) -> None:
    pytester.runpytest("-p", "no:cacheprovider")
    assert (pytester.path / ".kope" / ".gitignore").read_text().strip().endswith("*")
