"""Round 3: the candidate controls only its outputs (issue 49).

Candidates written against a judge that timed both kernels of a pair in one process, and ran the
tests, the clock and the verdict's signing where the candidate ran, each undid a defence from the
inside. Each is judged here against its own file with the trick switched off (`replay_run.
switched_off`: the same machine code, one data word differs), so any gain is the trick's:

- `patch_incumbent`: walks libc's ELF from memcpy's address to dl_iterate_phdr and mprotect and
  patches the other loaded `rowsum` to a correct copy four times slower (in one process it did:
  the incumbent ran 4x slower after its first call);
- `hog_threads`: two hidden threads streaming memory, to slow whatever else runs;
- `late_thread`: returns after an eighth of the rows, a thread of its own finishes the rest later;
- `timer_patch`: makes libc's clock_gettime writable and rewrites it.

In a kernel server of its own, stopped whenever it is not serving, none finds anything to patch or
slow, none gains: each ends uncrowned. Its honest twin (the same file, trick off) is crowned against
the committed kernel. The Python verdict forger is judged wrong where it cannot reach the verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_run import ReplayRun, switched_off

ROUND3 = Path(__file__).resolve().parent / "adversarial" / "round3"
TRICKS = ["patch_incumbent", "hog_threads", "late_thread", "timer_patch"]
ARGS = ("--kope-no-commit",)
# switched off, a trick is an honest vectorized kernel (its header's first flags: -O3 -march=native)
TWINS = [f"twin_{name}" for name in TRICKS]


@pytest.fixture(scope="module")
def tricks(tmp_path_factory) -> dict[str, ReplayRun]:
    """One run a trick, against its own file with the trick switched off."""
    return {
        name: ReplayRun(
            tmp_path_factory.mktemp(name),
            {"rowsum": [name]},
            ARGS,
            {"KOPE_C_SCREEN_BINARY": "0"},  # past the library screen: the kernel server is the boundary
            tricks=ROUND3,
            committed={"rowsum": switched_off("rowsum", name, ROUND3)},
        )
        for name in TRICKS
    }


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> ReplayRun:
    """The four tricks switched off, against the committed scalar rowsum."""
    folder = tmp_path_factory.mktemp("twins") / "tricks"
    (folder / "rowsum").mkdir(parents=True)
    for name, twin in zip(TRICKS, TWINS):
        (folder / "rowsum" / f"{twin}.c").write_text(switched_off("rowsum", name, ROUND3))
    return ReplayRun(tmp_path_factory.mktemp("twins-run"), {"rowsum": TWINS}, ARGS, tricks=folder)


@pytest.mark.parametrize("name", TRICKS)
def test_a_round3_trick_gains_nothing_and_is_not_crowned(tricks: dict[str, ReplayRun], name: str):
    run = tricks[name]
    verdict = run.verdict("rowsum", name)
    assert not run.crowned("rowsum", name), run.why("rowsum", name)
    assert verdict["outcome"] != "better", run.why("rowsum", name)
    if verdict["outcome"] == "ok":  # timed: no faster than its own code with the trick off
        assert (verdict.get("speedup") or 1.0) < 1.5, run.why("rowsum", name)


def test_a_late_finishing_thread_leaves_its_outputs_unwritten(tricks: dict[str, ReplayRun]):
    """Its server is stopped the moment it answers: what the thread had not written is not there."""
    run = tricks["late_thread"]
    verdict = run.verdict("rowsum", "late_thread")
    assert verdict["outcome"] == "incorrect", run.why("rowsum", "late_thread")


def test_a_timer_patch_may_make_no_memory_executable(tricks: dict[str, ReplayRun]):
    run = tricks["timer_patch"]
    verdict = run.verdict("rowsum", "timer_patch")
    assert verdict["outcome"] == "crashed", run.why("rowsum", "timer_patch")
    assert "SIGSYS" in " ".join(verdict.get("failures") or []), run.why("rowsum", "timer_patch")


def test_the_honest_twins_are_judged_correct_and_one_is_crowned(twins: ReplayRun):
    """One batch: all correct, the first timed beats the committed scalar loop and the others (the
    same honest code) are timed against the best so far; one is crowned (which one is chance)."""
    verdicts = {twin: twins.verdict("rowsum", twin) for twin in TWINS}
    assert all(v["outcome"] in ("ok", "better") for v in verdicts.values()), verdicts
    assert any(v["outcome"] == "better" for v in verdicts.values()), verdicts
    note = str(twins.ops["rowsum"].get("note") or "")
    if not twins.ops["rowsum"]["verified"] and "others used" in note:
        pytest.skip(f"a busy machine: {note}")  # the judge rightly refused to verify, not wrong
    assert any(twins.crowned("rowsum", twin) for twin in TWINS), twins.why("rowsum", TWINS[0])


def test_a_python_verdict_forger_finds_no_verdict_to_forge(tmp_path, monkeypatch):
    """The forger runs (screen off), finds no `Child` in its kernel server, and its halved outputs
    are judged wrong; the same file with the trick off is judged correct."""
    pytest.importorskip("triton")
    from test_differential import TESTS, _candidate, _repo

    from pytest_kope.judge.controller.runner import Judge
    from pytest_kope.judge.outcome import Outcome

    monkeypatch.setenv("KOPE_PY_SCREEN", "0")
    forger = (ROUND3 / "softmax" / "verdict_forger.py").read_text()
    twin = forger.replace("armed = True", "armed = False")
    tests = TESTS.format(source="softmax.py", empty="np.empty_like(x)", args="*_t(x, y), *x.shape", out="y")
    tests = tests.replace(
        "from pytest_kope import assert_close\n",
        "from pytest_kope import assert_close\nimport torch\n\n\ndef _t(x, y):\n"
        "    return torch.from_numpy(x), torch.from_numpy(y)\n",
    )
    plan = _repo(tmp_path, "softmax.py", twin, tests).with_settings(seeds=2)
    judge = Judge(plan, lambda c: [])
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        judged_forger, judged_twin = judge.correctness(
            [_candidate(plan, forger), _candidate(plan, twin + "\n")]
        )
    finally:
        judge.close()
    assert judged_forger.outcome == Outcome.INCORRECT, judged_forger.failures
    assert judged_twin.outcome == Outcome.OK, judged_twin.failures
