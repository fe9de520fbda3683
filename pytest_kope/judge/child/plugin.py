"""The plugin a judging child loads (`-p pytest_kope.judge.child.plugin --kope-child SPEC.json`, the
request as `JudgeRequest.to_json` wrote it).

It parametrizes the operator's tests over the candidate (and the seeds), keeps only the tests the
controller selected, sets the reference kernel for paired timing, records the committed kernel's
calls or replays them through the candidate (the differential check), and streams typed, signed
events as JSON lines so that a crash mid-run still leaves what happened before it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ...operator import base_nodeid, operator_of
from ..arrays import DEFAULT_RTOL
from ..protocol import read_key, sign
from ..request import JudgeRequest
from . import guards, state
from .guards import GuardedKernel

if TYPE_CHECKING:
    from .recorder import Recorder


def pytest_addoption(parser: pytest.Parser) -> None:
    """--kope-child FILE: this pytest process is a judging child with that request."""
    parser.addoption("--kope-child", dest="kope_child", help="(internal) judging spec for a child process")


class Child:
    """`key`: the signing key itself, in a forked child (it came through the fork server's request pipe,
    never the disk); else it is read from the pipe `request.key_fd` names."""

    def __init__(self, config: pytest.Config, request: JudgeRequest, key: bytes | None = None):
        self.config = config
        self.request = request
        self.candidate, self.reference, self.op = request.candidate, request.reference, request.operator
        self.selected = set(request.tests)
        self.seeds = request.seeds
        self.out = open(request.results, "a", buffering=1)  # noqa: SIM115 - line-buffered for the whole session
        self.kinds: dict[str, str] = {}
        self.seeds_of: dict[str, int] = {}  # item id -> the seed of its fresh inputs
        self.key = key if key is not None else read_key(request.key_fd)
        self.record = Path(request.record) if request.record else None
        self.replay = Path(request.replay) if request.replay else None
        self.rtol = float(DEFAULT_RTOL if request.rtol is None else request.rtol)  # 0: exact
        self.recorder: Recorder | None = None
        self.tests_s = 0.0  # in correctness test bodies, outside guarded calls: the tests' own code
        switches = request.guard_switches()
        if switches["record"]:
            from ... import oracle
            from .recorder import Recorder

            self.recorder = Recorder()
            oracle.ASSERTED = []  # the committed kernel's tests: their tolerances are the repo's bar
        self.run = state.of(config)
        self.run.switches = state.Switches(
            probe=switches["probe"], settled_in_replay=switches["settled_in_replay"], recorder=self.recorder
        )

    def emit(self, **event: Any) -> None:
        if self.out.closed:  # after `done`: nothing the controller reads can follow it
            return
        self.out.write(sign(self.key, json.dumps(event, default=str)) + "\n")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "kope_candidate" in metafunc.fixturenames:
            metafunc.parametrize(
                "kope_candidate", [self.candidate], ids=[f"kope-{self.candidate.short}"], indirect=True
            )
        if self.seeds and "kope_seed" in metafunc.fixturenames:
            metafunc.parametrize(
                "kope_seed", self.seeds, ids=[f"kope-seed{s}" for s in self.seeds], indirect=True
            )

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep = [i for i in items if base_nodeid(i.nodeid) in self.selected and operator_of(i) is not None]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
        self.emit(
            event="collected",
            t=time.monotonic(),
            items=[
                {
                    "id": i.nodeid,
                    "test": base_nodeid(i.nodeid),
                    "fresh": "kope_seed" in getattr(i, "fixturenames", ()),
                }
                for i in keep
            ],
        )

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.reference is None:
            return
        from .benchstash import bench_session as _bench_session
        from .building import build_cached

        bench = _bench_session(self.config)
        bench.reference = build_cached(self.config, self.op, self.reference)
        bench.rtol = self.rtol
        bench.settings = self.request.settings  # how paired timings stop (`Bench._time`)
        bench.flops = dict(self.op.flops)
        if self.request.ceilings:  # this machine's measured bandwidth and FMA ceilings
            from ..measure.physics import Ceilings

            bench.physics = Ceilings.from_json(self.request.ceilings)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.emit(event="start", test=base_nodeid(nodeid))
        if self.recorder is not None:
            self.recorder.test = base_nodeid(nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Any:
        began, guarded = time.perf_counter(), self.run.called_s
        try:
            return (yield)
        finally:
            if self.reference is None:  # a timing child's test body is the timing
                self.tests_s += time.perf_counter() - began - (self.run.called_s - guarded)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        if call.excinfo is not None:
            self.kinds[item.nodeid] = call.excinfo.typename
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "kope_seed" in callspec.params:
            self.seeds_of[item.nodeid] = callspec.params["kope_seed"]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return
        message = ""
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
        self.emit(
            event="report",
            id=report.nodeid,
            test=base_nodeid(report.nodeid),
            when=report.when,
            outcome=report.outcome,
            message=message[:4000],
            kind=self.kinds.get(report.nodeid, ""),
            seed=self.seeds_of.get(report.nodeid),
            seconds=report.duration,
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from .benchstash import BENCH

        failed = self.run.failed_builds
        for digest, (kind, message) in failed.items():
            self.emit(event="build_failed", candidate=digest, kind=kind, message=message[:4000])
        bench = self.config.stash.get(BENCH, None)
        for record in bench.paired if bench else []:
            self.emit(
                event="timing",
                suspect=record.suspect,
                mismatch=record.mismatch,
                **{**record.timing.__dict__, "test": base_nodeid(record.timing.test)},
            )
        if self.recorder is not None and self.record is not None:
            from ... import oracle

            self.run.switches.recorder = None
            asserted = oracle.loosest(oracle.ASSERTED or [])
            self.emit(event="recorded", count=self.recorder.write(self.record), asserted=asserted)
        if self.request.shrink is not None and self.replay is not None and not failed:
            self._shrink(session)
        elif self.replay is not None and not failed:  # even after a failure: it may be the test's
            self._replay()
        self.emit(
            event="done",
            t=time.monotonic(),
            build_s=sum(self.run.build_seconds),
            timed_s=bench.timed_s if bench else 0.0,
            kernel_s=bench.kernel_s if bench else 0.0,
            tests_s=self.tests_s,
        )
        self.out.close()

    def _replay(self) -> None:
        assert self.replay is not None  # called only with a recording to replay
        from .building import build_cached
        from .differential import ReplayDied, replay

        self.emit(event="start", test="differential check")
        try:
            kernel = GuardedKernel(
                build_cached(self.config, self.op, self.candidate), guards.replay_guards(), self.run
            )
        except BaseException as e:  # noqa: BLE001 - a failed build is reported by its own event
            self.emit(event="replayed", problems=[f"could not load the candidate: {e}"][:1])
            return
        # sanitized, the recorded calls once (no overlapping pairs) and no drawn calls: what a memory
        # error would show in them it shows in the tests' own calls and their replays
        once, kind = self.request.sanitize, ""
        try:
            problems = replay(self.replay, guards.functions_of(kernel), Path("replayed").resolve(), races=not once)
            if (
                not once and (self.replay / "draws" / "manifest.json").exists()
            ):  # calls drawn beyond the tests'
                problems += replay(self.replay / "draws", guards.functions_of(kernel), Path("replayed/draws").resolve())
        except ReplayDied as e:  # its server died or hung in a call: a crash (or time-out), named
            problems, kind = [e.text], e.kind
        except Exception as e:  # e.g. no thread can start: the candidate's own fork bomb filled the cgroup
            problems = [f"differential check: the replay failed: {type(e).__name__}: {e}"]
        self.emit(event="replayed", problems=problems[:5], kind=kind)

    def _shrink(self, session: pytest.Session) -> None:
        """Shrink a drawn call the controller found the candidate wrong on (`draws.shrink`): the
        minimal input for its failure message. Runs no test, so pytest's "no tests" is no failure."""
        request = self.request
        assert self.replay is not None and request.shrink is not None  # called only in that case
        from .building import build_cached
        from .drawing import shrink

        session.exitstatus = 0
        try:
            mine = build_cached(self.config, self.op, self.candidate).functions
            oracle = build_cached(self.config, self.op, request.shrink.oracle).functions
            smallest = shrink(self.replay / "draws", request.shrink.key, mine, oracle, self.rtol)
        except Exception as e:  # the message only: the verdict was made without it
            smallest = f"(could not shrink: {type(e).__name__}: {str(e)[:200]})"
        self.emit(event="shrunk", smallest=smallest[:2000])


def pytest_configure(config: pytest.Config) -> None:
    """Register the child plugin when --kope-child is given."""
    path = config.getoption("kope_child")
    if path:
        request = JudgeRequest.from_json(json.loads(Path(path).read_text()))
        config.pluginmanager.register(Child(config, request), "kope-child")
