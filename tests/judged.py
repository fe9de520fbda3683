"""Candidate files judged for correctness by the real judge (`Judge`), on a copy of an operator repo.

The plan is the one an optimize run makes: the operator and its tests as `pytest --collect-only`
finds them (in a process of its own: collecting inside a test process would share its plugins),
the toolchain's environment and its sanitizer switch. `judge_all` runs the committed kernel's
baseline (which records the calls every candidate replays) and then each candidate's correctness,
as the loop does before any timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pytest_kope.candidate import Candidate
from pytest_kope.judge.controller import sandbox
from pytest_kope.judge.controller.plan import Plan
from pytest_kope.judge.controller.runner import Judge
from pytest_kope.judge.outcome import Judged, Outcome
from pytest_kope.operator import Operator
from pytest_kope.toolchains.base import Toolchain, judging_env

COLLECT = """
import json, sys, pytest
from pytest_kope.operator import is_performance_test, operator_of

class Collect:
    items = []
    def pytest_collection_finish(self, session):
        Collect.items = list(session.items)

pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", "--rootdir", sys.argv[1], sys.argv[2]], [Collect()])
ops = {}
for item in Collect.items:
    op = operator_of(item)
    if op is not None:
        found = ops.setdefault(op.name, {"operator": op.to_json(), "correctness": [], "performance": [], "files": []})
        found["performance" if is_performance_test(item) else "correctness"].append(item.nodeid)
        if str(item.path) not in found["files"]:
            found["files"].append(str(item.path))
print("KOPE-PLANS " + json.dumps(ops))
"""


def plan_for(repo: Path, op: str, tc: Toolchain, logs: Path) -> Plan:
    """The judge's plan for operator `op` of the repo at `repo` (its tests under `repo/op`)."""
    ran = subprocess.run(
        [sys.executable, "-c", COLLECT, str(repo), str(repo / op)],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((x for x in ran.stdout.splitlines() if x.startswith("KOPE-PLANS ")), None)
    assert line is not None, ran.stdout[-2000:] + ran.stderr[-2000:]
    found = json.loads(line.removeprefix("KOPE-PLANS "))[op]
    return Plan(
        operator=Operator.from_json(found["operator"]),
        rootdir=repo,
        inifile=repo / "pytest.ini",
        files=[Path(f) for f in found["files"]],
        correctness=found["correctness"],
        performance=[],
        toolchain_env=judging_env(tc),
        limits=sandbox.Limits(wall_s=300),
        jobs=2,
        keep=logs,
        sanitize_env=tc.sanitize_env,
    )


def judge_all(plan: Plan, tc: Toolchain, sources: dict[str, str]) -> dict[str, Judged]:
    """Each named candidate source judged for correctness against the committed kernel."""
    judge = Judge(plan, tc.screen)
    op = plan.operator
    try:
        base = judge.baseline(op.baseline())
        assert base.outcome == Outcome.OK, base.failures
        made = [
            Candidate(text, op.source.name, op.toolchain, idea=name, agent="replay")
            for name, text in sources.items()
        ]
        return dict(zip(sources, judge.correctness(made)))
    finally:
        judge.close()
