"""A `suspect` verdict stands only against ceilings measured twice.

The physics probe runs once when a run starts; on a busy shared machine (or in a slow memory regime)
it can measure the ceilings several times too low, and an honest memory-bound kernel then seems
faster than physics. Before such a verdict stands, the judge measures the ceilings again (they only
rise) and times the candidate once more against them. Real children, a real probe: the stored
ceilings are this machine's own, divided as a busy probe would have measured them.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.judge.controller import sandbox
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.measure.physics import Ceilings
from pytest_kope.judge.outcome import Outcome
from pytest_kope.operator import Operator

SAMPLE = Path(__file__).resolve().parent.parent / "sample_ops"
TWIN = Path(__file__).resolve().parent / "adversarial" / "round2" / "rowsum" / "plain_twin.c"


@pytest.fixture(scope="module")
def true_ceilings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return Ceilings.measure(tmp_path_factory.mktemp("probe")).to_json()


def busy(ceilings: dict[str, Any], by: float) -> dict[str, Any]:
    """The ceilings as a probe on a machine busy by a factor `by` would have measured them."""
    return {**ceilings, **{k: [x / by for x in ceilings[k]] for k in ("read", "write", "copy")}}


def rowsum_plan(tmp_path: Path, ceilings: dict[str, Any]) -> Plan:
    shutil.copytree(SAMPLE / "rowsum", tmp_path / "rowsum")
    shutil.copy(SAMPLE / "pytest.ini", tmp_path / "pytest.ini")
    test = tmp_path / "rowsum" / "test_rowsum.py"
    op = Operator("rowsum", tmp_path / "rowsum" / "rowsum.c", "c", "rowwise", flops=(("*", "rows*(cols-1)"),))
    ids = [f"rowsum/test_rowsum.py::test_rowsum_matches_reference[{s}]" for s in ("1x1", "256x1000")]
    plan = Plan(
        operator=op,
        rootdir=tmp_path,
        inifile=tmp_path / "pytest.ini",
        files=[test],
        correctness=ids,
        performance=["rowsum/test_rowsum.py::test_rowsum_perf"],
    )
    return dataclasses.replace(
        plan,
        toolchain_env={"OMP_WAIT_POLICY": "passive"},
        limits=sandbox.Limits(wall_s=120),
        jobs=1,
        ceilings=ceilings,
        keep=tmp_path / "kept",
    )


def timed(tmp_path: Path, plan: Plan, source: str, remeasured: dict[str, Any] | None) -> Any:
    """The candidate's timing, how often the ceilings were measured again, and those the judge
    holds timings to after."""
    judge = Judge(plan, lambda c: [])
    calls: list[int] = []
    if remeasured is not None:

        def remeasure() -> dict[str, Any] | None:
            calls.append(1)
            return remeasured

        judge.remeasure = remeasure
    try:
        base = judge.baseline(plan.operator.baseline())
        assert base.outcome == Outcome.OK, base.failures
        (judged,) = judge.correctness([Candidate(source, "rowsum.c", "c", idea="t", agent="replay")])
        assert judged.outcome == Outcome.OK, judged.failures
        return judge.performance(judged, base.candidate), calls, judge.ceilings
    finally:
        judge.close()


def test_an_honest_kernel_under_a_busy_probes_ceilings_is_timed_again_and_believed(tmp_path, true_ceilings):
    plan = rowsum_plan(tmp_path, busy(true_ceilings, 100))
    judged, calls, ceilings = timed(tmp_path, plan, TWIN.read_text(), true_ceilings)
    assert calls == [1]
    assert judged.outcome == Outcome.OK and judged.timings, (judged.outcome, judged.notes)
    assert any(n.startswith("timed again") for n in judged.notes), judged.notes
    assert ceilings == true_ceilings


def test_without_a_second_measurement_the_busy_probes_ceilings_stand(tmp_path, true_ceilings):
    plan = rowsum_plan(tmp_path, busy(true_ceilings, 100))
    judged, _, _ = timed(tmp_path, plan, TWIN.read_text(), None)
    assert judged.outcome == Outcome.SUSPECT, judged.notes
    assert "faster than physics allows" in judged.reason


def test_ceilings_that_did_not_rise_time_nothing_again(tmp_path, true_ceilings):
    plan = rowsum_plan(tmp_path, busy(true_ceilings, 100))
    judged, calls, _ = timed(tmp_path, plan, TWIN.read_text(), busy(true_ceilings, 100))
    assert calls == [1] and judged.outcome == Outcome.SUSPECT, judged.notes
    assert not any(n.startswith("timed again") for n in judged.notes), judged.notes


def test_a_time_still_beyond_the_risen_ceilings_stays_suspect(tmp_path, true_ceilings):
    plan = rowsum_plan(tmp_path, busy(true_ceilings, 100))
    judged, calls, _ = timed(tmp_path, plan, TWIN.read_text(), busy(true_ceilings, 50))
    assert calls == [1] and judged.outcome == Outcome.SUSPECT, judged.notes
    assert any(n.startswith("timed again") for n in judged.notes), judged.notes
