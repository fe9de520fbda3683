"""The controller never reads back what a child could have written for its own verdict (issue 35).

A Python candidate runs its module's code in its judging child. One that escaped the screen once
rewrote the differential check's recorded `manifest.json` (every `repeats` to 0): the controller read
it again after the child and compared nothing, for that candidate and every later one. Now the
manifests and the committed kernel's outputs are read once, before any candidate runs, and held by
the controller; a change to the recorded folder fails the child that ran while it happened, and the
calls are recorded afresh for the next. Unjailed (the folder is writable) and jailed (read-only).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_differential import TESTS, TRITON_KERNEL, TRITON_NO_MAX, _candidate, _repo, needs_triton

from pytest_kope.judge.controller import sandbox
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.outcome import Judged, Outcome

# At import, in its judging child: every recorded call's repeats set to 0, so nothing would be
# compared; then the kernel that gives NaN on large rows (no max subtracted).
REWRITE = """\
import json, pathlib
for _m in pathlib.Path({folder!r}).rglob("manifest.json"):
    try:
        _d = json.loads(_m.read_text())
        for _e in _d:
            _e["repeats"] = 0
        _m.write_text(json.dumps(_d))
    except OSError:
        pass  # read-only in the jail: the kernel is judged as it is
"""


def _triton_plan(tmp_path: Path) -> Plan:
    tests = TESTS.format(source="softmax.py", empty="np.empty_like(x)", args="*_t(x, y), *x.shape", out="y")
    tests = tests.replace(
        "from pytest_kope import assert_close\n",
        "from pytest_kope import assert_close\nimport torch\n\n\ndef _t(x, y):\n"
        "    return torch.from_numpy(x), torch.from_numpy(y)\n",
    )
    plan = _repo(tmp_path, "softmax.py", TRITON_KERNEL, tests)
    return plan.with_settings(seeds=1)


def _judged_after_a_rewrite(plan: Plan) -> tuple[Judge, list[Judged], list[Path | None]]:
    judge = Judge(plan, lambda c: [])  # as if it had passed the screen: the screen is not the boundary
    try:
        assert judge.baseline(plan.operator.baseline()).outcome == Outcome.OK
        first = judge.recorded
        cheat = REWRITE.format(folder=str(first)) + TRITON_NO_MAX
        (rewriter,) = judge.correctness([_candidate(plan, cheat)])
        honest, wrong = judge.correctness(
            [_candidate(plan, TRITON_KERNEL + "\n"), _candidate(plan, TRITON_NO_MAX)]
        )
        return judge, [rewriter, honest, wrong], [first, judge.recorded]
    finally:
        judge.close()


@needs_triton
def test_a_rewritten_manifest_fails_its_writer_and_is_recorded_again_unjailed(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "bubblewrap", lambda: (None, "hidden for this test: unjailed"))
    _, (rewriter, honest, wrong), (first, now) = _judged_after_a_rewrite(_triton_plan(tmp_path))
    assert rewriter.outcome == Outcome.INCORRECT, rewriter.failures
    assert "recorded calls" in rewriter.failures[0] and "changed while this child ran" in rewriter.failures[0]
    assert now != first  # recorded afresh for the candidates after it
    assert honest.outcome == Outcome.OK, honest.failures
    assert wrong.outcome == Outcome.INCORRECT and "differential check" in wrong.failures[0], wrong.failures


@needs_triton
def test_in_the_jail_the_recording_is_read_only_and_the_kernel_is_judged_as_it_is(tmp_path):
    if sandbox.bubblewrap()[0] is None:
        pytest.skip("needs bubblewrap")
    _, (rewriter, honest, _), (first, now) = _judged_after_a_rewrite(_triton_plan(tmp_path))
    assert rewriter.outcome == Outcome.INCORRECT and "differential check" in rewriter.failures[0]
    assert now == first and honest.outcome == Outcome.OK, honest.failures
