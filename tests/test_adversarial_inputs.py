"""Timed inputs no kernel can predict, parked results no kernel can reach: round-2 tricks, end to end.

Each trick (`tests/adversarial/round2/<op>/`) is the committed kernel's own plain loops plus a cache
or a theft that made it look several times faster under a judge whose timed copies were the test's
inputs times one factor each, and which parked one kernel's outputs in a buffer the other had been
given. Under fresh inputs (every element perturbed on its own, seeds from the operating system) and
parking in memory no kernel is given, the trick never fires: each ends uncrowned, never `better`,
with no gain. Its honest twin, timed on the same fresh inputs and checked in the same rounds, is
still crowned. (Twins are named to be judged last: a trick is judged against the committed kernel,
where the old judge made it `better`.)
"""

from __future__ import annotations

import pytest
from replay_run import ReplayRun

SGEMM_TRICKS = ["scale_cache", "paced_cache", "parked_thief"]
ARGS = ("--kope-no-commit",)


@pytest.fixture(scope="module")
def sgemm(tmp_path_factory) -> ReplayRun:
    return ReplayRun(tmp_path_factory.mktemp("sgemm"), {"sgemm": [*SGEMM_TRICKS, "twin_blocked"]}, ARGS)


@pytest.fixture(scope="module")
def rmsnorm(tmp_path_factory) -> ReplayRun:
    return ReplayRun(
        tmp_path_factory.mktemp("rmsnorm"), {"rmsnorm": ["scale_cache", "twin_vectorized"]}, ARGS
    )


def _assert_no_gain(run: ReplayRun, op: str, name: str) -> None:
    """The trick is not crowned and gains nothing: its honest path is the committed kernel's."""
    verdict = run.verdict(op, name)
    assert not run.crowned(op, name), verdict
    assert verdict["outcome"] != "better", verdict
    if verdict["outcome"] == "ok":  # it never fired: as slow as the kernel it copies
        assert (verdict.get("speedup") or 1.0) < 1.5, verdict


@pytest.mark.parametrize("name", SGEMM_TRICKS)
def test_an_sgemm_trick_finds_no_input_it_saw_and_no_parked_result(sgemm, name):
    _assert_no_gain(sgemm, "sgemm", name)


def test_the_honest_blocked_sgemm_is_crowned_on_fresh_inputs(sgemm):
    verdict = sgemm.verdict("sgemm", "twin_blocked")
    assert sgemm.crowned("sgemm", "twin_blocked"), sgemm.why("sgemm", "twin_blocked")
    assert verdict["outcome"] == "better" and (verdict.get("speedup") or 0) > 1.5, verdict


def test_a_scale_keyed_rmsnorm_cache_finds_no_scaled_input(rmsnorm):
    _assert_no_gain(rmsnorm, "rmsnorm", "scale_cache")


def test_the_honest_vectorized_rmsnorm_is_crowned_on_fresh_inputs(rmsnorm):
    verdict = rmsnorm.verdict("rmsnorm", "twin_vectorized")
    assert rmsnorm.crowned("rmsnorm", "twin_vectorized"), rmsnorm.why("rmsnorm", "twin_vectorized")
    assert verdict["outcome"] == "better", verdict
