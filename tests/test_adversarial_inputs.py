"""Timed inputs no kernel can predict, parked results no kernel can reach: round-2 tricks, end to end.

Each trick (`tests/adversarial/round2/<op>/`) is the committed kernel's own plain loops plus a cache
or a theft that made it look several times faster under a judge whose timed copies were the test's
inputs times one factor each, and which parked one kernel's outputs in a buffer the other had been
given. Under fresh inputs (every element perturbed on its own, seeds from the operating system) and
parking in memory no kernel is given, the trick never fires: each ends uncrowned, never `better`,
with no gain.

Each trick is judged against its own file with the trick switched off (`replay_run.switched_off`),
committed in the operator's place: the same machine code, so no gain can come from where the
compiler happened to place the loops (on a Zen 3 the same plain sgemm loops ran 2x apart from one
build to the other). Its honest twin, judged after it on the same fresh inputs, is still crowned.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from replay_run import ReplayRun, switched_off

SGEMM_TRICKS = ["scale_cache", "paced_cache", "parked_thief"]
TWINS = {"sgemm": "twin_blocked", "rmsnorm": "twin_vectorized"}  # named to be judged after any trick
ARGS = ("--kope-no-commit",)

Runs = Callable[[str, str], ReplayRun]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    """The run of `<op>/<trick>.c` and the operator's twin against the trick switched off (once)."""
    made: dict[tuple[str, str], ReplayRun] = {}

    def run(op: str, trick: str) -> ReplayRun:
        if (op, trick) not in made:
            made[op, trick] = ReplayRun(
                tmp_path_factory.mktemp(f"{op}-{trick}"),
                {op: [trick, TWINS[op]]},
                ARGS,
                committed={op: switched_off(op, trick)},
            )
        return made[op, trick]

    return run


def _assert_no_gain(run: ReplayRun, op: str, name: str) -> None:
    """The trick is not crowned and gains nothing over its own code with the trick off."""
    verdict = run.verdict(op, name)
    assert not run.crowned(op, name), run.why(op, name)
    assert verdict["outcome"] != "better", run.why(op, name)
    if verdict["outcome"] == "ok":  # it never fired: as fast as its own code with the trick off
        assert (verdict.get("speedup") or 1.0) < 1.5, run.why(op, name)


def _assert_twin_crowned(run: ReplayRun, op: str, min_speedup: float) -> None:
    twin = TWINS[op]
    verdict = run.verdict(op, twin)
    assert run.crowned(op, twin), run.why(op, twin)
    assert verdict["outcome"] == "better" and (verdict.get("speedup") or 0) > min_speedup, verdict


@pytest.mark.parametrize("name", SGEMM_TRICKS)
def test_an_sgemm_trick_finds_no_input_it_saw_and_no_parked_result(runs: Runs, name: str):
    _assert_no_gain(runs("sgemm", name), "sgemm", name)


def test_the_honest_blocked_sgemm_is_crowned_on_fresh_inputs(runs: Runs):
    _assert_twin_crowned(runs("sgemm", SGEMM_TRICKS[-1]), "sgemm", 1.5)


def test_a_scale_keyed_rmsnorm_cache_finds_no_scaled_input(runs: Runs):
    _assert_no_gain(runs("rmsnorm", "scale_cache"), "rmsnorm", "scale_cache")


def test_the_honest_vectorized_rmsnorm_is_crowned_on_fresh_inputs(runs: Runs):
    _assert_twin_crowned(runs("rmsnorm", "scale_cache"), "rmsnorm", 1.0)
