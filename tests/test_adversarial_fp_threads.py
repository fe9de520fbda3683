"""Round 2: a kernel that leaves flush-to-zero set in its OpenMP workers, never in the calling thread:
on every call (`pool_ftz`), or only in timed calls (`pool_ftz_timed`), which are not guarded."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from replay_run import ReplayRun

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="MXCSR is x86-64's")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ReplayRun:
    return ReplayRun(
        tmp_path_factory.mktemp("fp-threads"), {"gelu": ["pool_ftz", "pool_ftz_twin", "pool_ftz_timed"]}
    )


def test_ftz_left_in_the_openmp_pool_is_incorrect_naming_the_state_and_thread(run: ReplayRun) -> None:
    verdict = run.verdict("gelu", "pool_ftz")
    assert verdict["outcome"] == "incorrect", verdict
    failures = " ".join(verdict["failures"])
    assert "floating-point control state changed in" in failures and "other thread(s): thread " in failures
    assert "flush-to-zero on" in failures
    assert not run.crowned("gelu", "pool_ftz")


def test_ftz_left_in_the_pool_by_timed_calls_only_fails_the_timing(run: ReplayRun) -> None:
    verdict = run.verdict("gelu", "pool_ftz_timed")
    assert verdict["outcome"] == "incorrect", verdict
    failures = " ".join(verdict["failures"])
    assert "test_gelu_perf" in failures and "in timed calls" in failures
    assert "floating-point control state changed in" in failures and "flush-to-zero on" in failures
    assert not run.crowned("gelu", "pool_ftz_timed")


def test_its_honest_twin_is_crowned_and_committed(run: ReplayRun) -> None:
    assert run.verdict("gelu", "pool_ftz_twin")["outcome"] == "better"
    assert run.crowned("gelu", "pool_ftz_twin"), run.why("gelu", "pool_ftz_twin")
    committed = run.committed_source("gelu")
    assert committed is not None and "#define TRICK 0" in committed


def test_the_twins_only_difference_is_the_trick() -> None:
    here = Path(__file__).parent / "adversarial" / "round2" / "gelu"
    cheat, twin = (
        [line for line in (here / f"{n}.c").read_text().splitlines() if not line.startswith("//")]
        for n in ("pool_ftz", "pool_ftz_twin")
    )
    assert len(cheat) == len(twin)
    assert [(a, b) for a, b in zip(cheat, twin) if a != b] == [("#define TRICK 1", "#define TRICK 0")]
