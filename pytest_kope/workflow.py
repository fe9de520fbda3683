"""The loop, per operator: baseline, recall, propose, judge, remember, repeat; then verify and commit.

Registered as the `KopeSession` plugin only under `--kope-optimize`; it replaces the test run loop.
"""

from __future__ import annotations

import copy
import datetime
import os
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import report
from .agents import explore_rate
from .agents.base import Context, OperatorInfo
from .agents.tuner import Tuner
from .candidate import Candidate
from .errors import BaselineBroken, ConfigError, InfrastructureFault, KopeError, SpecError
from .hardware import label
from .judge import sandbox
from .judge.building import toolchain_of
from .judge.executors import EXECUTORS, Executor, NodeReservation
from .judge.outcome import Judged, Outcome
from .judge.ray_executor import make_executor
from .judge.runner import Judge, Plan
from .judge.stats import PairedRatio
from .operator import Operator, is_performance_test, operator_of
from .paths import ensure_kope_dir, kope_home
from .report_md import markdown
from .scheduler import OneAtATime, each
from .settings import SEED
from .spec import parse_spec
from .stopping import RunClock, Slot, Stop, StopRule, stopped


def _setting(config: pytest.Config, name: str, default: Any) -> Any:
    value = config.getoption(name)
    if value is None:
        try:
            value = config.getini(name)
        except ValueError:
            value = None
    return default if value in (None, "") else value


def _nothing_new(agent: Any) -> tuple[Stop, str]:
    return Stop.AGENT_DONE, f"the {getattr(agent, 'name', 'agent')} agent proposed nothing new"


def _declares_knobs(judged: Judged) -> bool:
    """An incumbent written by an agent (not the tuner) that declares a tuning space of its own."""
    c = judged.candidate
    if c.agent in ("baseline", "tuner"):
        return False
    try:
        return bool(parse_spec(c.source, c.filename).space.axes)
    except SpecError:
        return False


@dataclass
class _Progress:
    """One operator's search so far: what resuming and the search loop update."""

    op: Operator
    judge: Judge
    info: OperatorInfo
    hw: dict
    task: int
    baseline: Judged
    rule: StopRule
    remember: Callable[[Judged], None]
    incumbent: Judged = None  # type: ignore[assignment]  # the baseline until something beats it
    history: list[Judged] = field(default_factory=list)
    best_at: int = 0  # the evaluation that found the incumbent
    started: float = field(default_factory=time.monotonic)  # for the evaluations per minute

    def __post_init__(self) -> None:
        self.incumbent = self.incumbent or self.baseline

    def judged(self, batch: list[Judged], seconds: float) -> None:
        """A judged batch: the stop rule counts it; a candidate crowned BETTER is the new incumbent."""
        self.rule.record([j.outcome == Outcome.BETTER for j in batch], seconds)
        for i, j in enumerate(batch, self.rule.evaluations - len(batch) + 1):
            self.history.append(j)
            if j.outcome == Outcome.BETTER:
                self.incumbent, self.best_at = j, i


@dataclass
class OperatorRun:
    op: Operator
    items: list[pytest.Item]
    summary: dict[str, Any] = field(default_factory=dict)


class KopeSession:
    """The optimize-mode plugin: owns the graph, the agent, the judge and the report."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.budget = int(_setting(config, "kope_budget", 24))
        self.agent_name = str(_setting(config, "kope_agent", "auto"))
        self.min_gain = float(_setting(config, "kope_min_gain", 0.05))
        self.fork_server = _setting(config, "kope_fork_server", True) not in (False, "false", "0", "no")
        self.seeds = int(_setting(config, "kope_seeds", 2))
        self.timeout = float(_setting(config, "kope_timeout", 120.0))
        self.jobs = int(_setting(config, "kope_jobs", len(os.sched_getaffinity(0))))
        self.prefix = str(_setting(config, "kope_branch_prefix", "kope/"))
        self.no_commit = bool(config.getoption("kope_no_commit"))
        self.check_only = bool(config.getoption("kope_check"))
        self.since = _setting(config, "kope_since", None)
        self.since_line = ""
        self.patience = int(_setting(config, "kope_patience", 8))
        minutes = _setting(config, "kope_time_budget", None)
        self.clock = RunClock(float(minutes) if minutes is not None else None)
        if self.budget < 1:
            raise pytest.UsageError(f"--kope-budget must be at least 1, got {self.budget}")
        if self.patience < 0:
            raise pytest.UsageError(f"--kope-patience must be 0 (off) or more, got {self.patience}")
        if self.clock.limited and self.clock.minutes < 0:
            raise pytest.UsageError(f"--kope-time-budget takes minutes, 0 or more; got {self.clock.minutes}")
        self.operators: OrderedDict[str, OperatorRun] = OrderedDict()
        self.broken: list[str] = []
        self.tw = None
        # -- where children run, and how many operators at once (judge/executors.py, scheduler.py)
        self.executor_name = str(_setting(config, "kope_executor", "local"))
        self.concurrency = int(_setting(config, "kope_concurrency", 1))
        if self.executor_name not in EXECUTORS:
            raise pytest.UsageError(
                f"--kope-executor {self.executor_name}: no such executor; choose one of {', '.join(EXECUTORS)}"
            )
        if self.concurrency < 1:
            raise pytest.UsageError(f"--kope-concurrency must be at least 1, got {self.concurrency}")
        self.executor: Executor | None = None
        self.node = NodeReservation() if self.concurrency > 1 else None
        self.timing_slots: dict[tuple[int, ...], queue.Queue[int | None]] = {}
        self.faults: dict[str, list[str]] = {}  # operator -> judgements lost to the machinery
        self.agents: list[Any] = []  # each operator's own agent under --kope-concurrency
        self._output = threading.Lock()

    # -- pytest hooks --------------------------------------------------------------------------
    def pytest_configure(self, config: pytest.Config) -> None:
        try:
            self.explore_rate = explore_rate(config)
            self.agent = config.hook.pytest_kope_make_agent(name=self.agent_name, config=config)
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        if self.agent is None:
            raise pytest.UsageError(
                f"--kope-agent {self.agent_name}: no such agent (tuner, claude, replay:DIR)"
            )
        # Candidates from any agent but the built-in tuner (which only rebuilds the committed source) are
        # untrusted code: they run only in the jail unless the user says otherwise.
        self.allow_unjailed = bool(_setting(config, "kope_allow_unjailed", False))
        unjailed_ok = type(self.agent) is Tuner or self.allow_unjailed
        try:
            sandbox.require_jail(getattr(self.agent, "name", self.agent_name), unjailed_ok)
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        for item in items:
            op = operator_of(item)
            if op is not None:
                self.operators.setdefault(op.name, OperatorRun(op, [])).items.append(item)

    @pytest.hookimpl(wrapper=True, specname="pytest_collection_modifyitems")
    def pytest_collection_modifyitems_since(
        self, session: pytest.Session, config: pytest.Config, items: list
    ):
        """--kope-since REF: narrow (or, with -k, widen) the operators to those changed since REF.
        (Named pytest_* with a specname: pytest reads hook options only from pytest_* names.)"""
        before = list(items)
        yield
        if not self.since:
            return
        from .since import select

        try:
            items[:], self.since_line = select(
                config.rootpath,
                self.since,
                before,
                items,
                bool(config.option.keyword),
                lambda dropped: config.hook.pytest_deselected(items=dropped),
            )
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        self.operators.clear()
        for item in items:
            op = operator_of(item)
            if op is not None:
                self.operators.setdefault(op.name, OperatorRun(op, [])).items.append(item)

    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.config.option.collectonly:
            return False
        self.tw = session.config.pluginmanager.get_plugin("terminalreporter")
        self._start(session)
        if self.check_only:
            from .doctor import check

            session.testsfailed = check(self)
            self.graph.close()
            return True
        runs = list(self.operators.values())
        if self.concurrency > 1:
            self._measure_ceilings_once(runs)
        each(runs, self._operator, self.concurrency)
        session.testsfailed = sum("error" in run.summary for run in runs)
        self._finish()
        return True

    def _operator(self, run: OperatorRun, left: int) -> None:
        """One operator from baseline to commit; `left`: operators not started yet, this one included.
        Under --kope-concurrency each runs in a thread of its own, with its own agent (`_view`)."""
        # an operator's minimum: one round that keeps each correctness worker busy once
        slot = self.clock.slot(left, self.jobs) if self.clock.limited else None
        if self.clock.limited and slot is None:
            why = f"the time budget ({self.clock.minutes:g} min) ran out before it began"
            self.say(f"kope {run.op.name}: not started: {why}")
            run.summary = {
                "name": run.op.name,
                "verified": False,
                "stopped": stopped(Stop.NOT_REACHED, why),
            }
        else:
            try:
                run.summary = self._view()._optimize(run, slot)
            except KopeError as e:  # BaselineBroken, an unavailable toolchain, no correctness tests
                self.say(f"kope {run.op.name}: STOPPED: {e}", red=True)
                run.summary = {
                    "name": run.op.name,
                    "error": str(e),
                    "verified": False,
                    "stopped": stopped(Stop.ERROR, str(e)),
                }
        if self.faults.get(run.op.name):
            run.summary["infrastructure_faults"] = self.faults[run.op.name]
        self.config.hook.pytest_kope_operator_done(
            operator=run.op.name, summary=run.summary, config=self.config
        )

    def _view(self) -> KopeSession:
        """The session as one operator sees it. Under --kope-concurrency: its own agent (an agent's
        search state is per operator), and the same graph, publisher, clock, terminal and executor."""
        if self.concurrency <= 1:
            return self
        view = copy.copy(self)
        view.agent = self.config.hook.pytest_kope_make_agent(name=self.agent_name, config=self.config)
        if hasattr(view.agent, "graph_sink"):
            view.agent.graph_sink = self.agent.graph_sink
        self.agents.append(view.agent)
        return view

    def _measure_ceilings_once(self, runs: list[OperatorRun]) -> None:
        """The machine's ceilings, measured before the operators start at once (never twice at a time)."""
        for name in sorted({run.op.toolchain for run in runs}):
            try:
                self._ceilings(toolchain_of(self.config, name))
            except Exception:  # noqa: BLE001 - the operator that needs it meets the same error and says it
                pass

    def _batch(self) -> int:
        """Candidates per round: enough to keep every correctness worker busy twice."""
        return max(2, self.jobs * 2)

    # -- setup -----------------------------------------------------------------------------------
    def _start(self, session: pytest.Session) -> None:
        from .memory.graph import Graph
        from .vcs import Vcs

        home, warning = kope_home(
            Path(str(self.config.rootpath)), [r.op.source for r in self.operators.values()]
        )
        self.home = home
        if warning:
            self.say(f"kope: {warning}", red=True)
        base = self.kope_base = ensure_kope_dir(home / ".kope")
        db = _setting(self.config, "kope_db", None)
        self.graph = Graph(Path(db) if db else base / "experience.db")
        self.run_dir = ensure_kope_dir(base) / "runs" / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.vcs = None if self.no_commit else Vcs.find(home)
        self.no_commit_why = (
            "--kope-no-commit" if self.no_commit else "" if self.vcs else f"no git repository at {home}"
        )
        if self.vcs is not None:
            for path in self.vcs.prune_stale_worktrees():
                self.say(f"kope: removed a worktree a killed run left behind: {path}")
        from .publish import Publisher

        self.publisher = Publisher(self.config, self.vcs, self.run_id, self.prefix, self.run_dir, self.graph)
        self.publisher.say = self.say
        self._start_executor()
        if self.since_line:
            self.say(self.since_line)
        self.say(
            f"kope: run {self.run_id}, agent {self.agent_name} ({self.agent.name}), budget {self.budget} "
            f"evaluations per operator, {len(self.operators)} operator(s)"
        )
        names = sorted(
            {n for names in self.config.hook.pytest_kope_toolchain_names(config=self.config) for n in names}
        )
        self.availability = {}
        for name in names:
            try:
                a = toolchain_of(self.config, name).availability()
                self.availability[name] = {"available": a.ok, "reason": a.reason}
            except Exception as e:  # a broken optional toolchain must not stop the C one
                self.availability[name] = {"available": False, "reason": f"{type(e).__name__}: {e}"}
            state = "available" if self.availability[name]["available"] else "unavailable"
            self.say(f"kope: toolchain {name}: {state}: {self.availability[name]['reason']}")
        for line in sandbox.isolation_summary():
            self.say(f"kope: isolation: {line}")
        hw = {}
        for run in self.operators.values():
            hw = toolchain_of(self.config, run.op.toolchain).fingerprint()
            break
        self.hardware = hw
        if hw:
            self.say(f"kope: hardware: {label(hw, self.graph.ceilings(hw))}")
        if self.clock.limited:
            self.say(
                f"kope: time budget {self.clock.minutes:g} min for the whole run, shared by the operators"
            )
        self.graph.start_run(self.run_id, self.agent_name, hw)
        if hasattr(self.agent, "graph_sink"):  # LLM agents report every call's tokens to the graph
            self.agent.graph_sink = lambda op, model, used: self.graph.record_llm_call(
                self.run_id, op, model, used
            )

    def _start_executor(self) -> None:
        """Connect to Ray for `--kope-executor ray`; with operators at once, the graph and the
        publisher take calls one at a time (the controller stays their only writer)."""
        if self.concurrency > 1:
            self.graph = OneAtATime(self.graph)  # type: ignore[assignment]
            self.publisher = OneAtATime(self.publisher)  # type: ignore[assignment]
        try:
            self.executor = make_executor(self.executor_name, self.home, ship=self._ray_repo() == "ship")
        except ConfigError as e:
            raise pytest.UsageError(str(e)) from None
        if self.executor is not None:
            self.node = None  # the executor reserves nodes and devices (Ray resources)
            if _setting(self.config, "kope_jobs", None) is None:
                self.jobs = self.executor.cpus()  # correctness workers: the cluster's cores
            self.say(f"kope: executor {self.executor.describe()}")
        if self.concurrency > 1:
            self.say(f"kope: {self.concurrency} operators at once, each with its own budget")

    def _ray_repo(self) -> str:
        how = str(_setting(self.config, "kope_ray_repo", "ship"))
        if how not in ("ship", "shared"):
            raise pytest.UsageError(f"--kope-ray-repo takes ship or shared, got {how!r}")
        return how

    def _fault(self, op: Operator, j: Judged) -> None:
        """A judgement lost to the machinery: reported, never recorded as the candidate's verdict."""
        self.faults.setdefault(op.name, []).append(f"{j.candidate.short}: {j.fault}")
        self.say(f"kope {op.name}: infrastructure fault, {j.candidate.short} not judged: {j.fault}", red=True)

    def say(self, line: str, red: bool = False) -> None:
        if self.tw is not None:
            with self._output:
                self.tw.write_line(line, red=red)

    # -- one operator ----------------------------------------------------------------------------
    def _plan(self, run: OperatorRun) -> tuple[Plan, Any]:
        op = run.op
        tc = toolchain_of(self.config, op.toolchain)
        available = tc.availability()
        if not available.ok:
            raise KopeError(f"toolchain {tc.name} is unavailable here: {available.reason}")
        files = sorted({Path(str(i.path)) for i in run.items})
        correctness = [self._nodeid(i) for i in run.items if not is_performance_test(i)]
        performance = [self._nodeid(i) for i in run.items if is_performance_test(i)]
        if not correctness:
            raise KopeError(
                f"operator {op.name} has no correctness tests selected; nothing would judge a candidate"
            )
        plan = Plan(
            op,
            self.home,
            Path(str(self.config.inipath)) if self.config.inipath else None,
            files,
            correctness,
            performance,
            dict(tc.environment()),
            sandbox.Limits(wall_s=self.timeout, device=bool(getattr(tc, "count_devices", lambda: 0)())),
            self.seeds,
            self.jobs,
            self.run_dir / op.name,
            self._devices(tc),
            tuple(self.config.getini("kope_plugins")),
            self._ceilings(tc),
            fork_server=self.fork_server,
            min_gain=self.min_gain,
            executor=self.executor,
            node=self.node,
            jail_required=not (type(self.agent) is Tuner or self.allow_unjailed),
        )
        if self.executor is not None:
            try:
                self.executor.require(plan)
            except ConfigError as e:
                raise KopeError(str(e)) from None
        elif self.concurrency > 1:  # one device (or the CPU) times one operator's candidate at a time
            with self._output:
                if plan.devices not in self.timing_slots:
                    slots: queue.Queue[int | None] = queue.Queue()
                    for device in plan.devices or (None,):
                        slots.put(device)
                    self.timing_slots[plan.devices] = slots
            plan.timing_slots = self.timing_slots[plan.devices]
        return plan, tc

    def _ceilings(self, tc: Any) -> dict[str, Any] | None:
        """This machine's measured memory and FMA ceilings, for kernels timed on the host CPU."""
        if not getattr(tc, "timed_on_host", False):
            return None
        from .judge.physics import PhysicsProbeFailed, ceilings_for

        fresh = not getattr(
            self, "_ceilings_measured", False
        )  # measured again once a run: ceilings only rise
        self._ceilings_measured = True
        try:
            found = ceilings_for(self.graph, tc.fingerprint(), self.kope_base / "builds", refresh=fresh)
            return found.to_json()
        except PhysicsProbeFailed as e:
            self.say(f"kope: no physical bound on timings: {e}", red=True)
            return None

    def _nodeid(self, item: pytest.Item) -> str:
        """The item's id as a judging child rooted at the run's home sees it (pytest's when they agree)."""
        if self.home == Path(str(self.config.rootpath)).resolve():
            return item.nodeid
        path = Path(str(item.path)).resolve().relative_to(self.home).as_posix()
        return f"{path}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else path

    def _devices(self, tc: Any) -> tuple[int, ...]:
        """--kope-devices 0,1 (or ini kope_devices), else every device the toolchain counts (none on a CPU)."""
        given = str(_setting(self.config, "kope_devices", "")).strip()
        if given:
            try:
                return tuple(int(d) for d in given.split(",") if d.strip())
            except ValueError:
                raise pytest.UsageError(
                    f"--kope-devices takes device indices like 0,1; got {given!r}"
                ) from None
        count = getattr(tc, "count_devices", lambda: 0)()
        return tuple(range(count))

    def _optimize(self, run: OperatorRun, slot: Slot | None = None) -> dict[str, Any]:
        op = run.op
        started = time.monotonic()
        plan, tc = self._plan(run)
        judge = Judge(plan, tc.screen)
        timer = tc.timer()
        can_time = timer.can_time and bool(plan.performance)
        hw = tc.fingerprint()
        task = self.graph.task_id(op.name, op.family, op.toolchain, hw)

        baseline = judge.baseline(op.baseline())
        if not baseline.outcome.correct:
            raise BaselineBroken(
                f"the committed kernel {op.source} fails its own correctness tests "
                f"({baseline.outcome.value}): {(baseline.failures or ['?'])[0][:500]}"
            )
        baseline.speedup = 1.0
        if baseline.fixed_inputs and len(baseline.fixed_inputs) == len(baseline.tests_passed):
            self.say(
                f"kope {op.name}: correctness rests on fixed inputs: no test takes the `rng` fixture, so every "
                "candidate sees the inputs the tests make themselves; consider the `rng` fixture",
                red=True,
            )
        if can_time:
            judge.performance(baseline, baseline.candidate)
            if baseline.fault:
                raise InfrastructureFault(f"timing the committed kernel: {baseline.fault}")
        else:
            why = timer.why_not or "no performance test selected"
            self.say(f"kope {op.name}: not timing: {why}; nothing will be committed")
        baseline.outcome = Outcome.OK
        self.graph.record(task, self.run_id, baseline)
        self.clock.baselines.append(time.monotonic() - started)
        info = OperatorInfo(
            op.name,
            op.family,
            op.toolchain,
            op.source.name,
            op.text,
            op.spec.space,
            op.spec.kernels,
            {str(f): f.read_text() for f in plan.files},
        )

        flaky: list[str] = [n for n in baseline.notes if n.startswith("flaky test:")]
        for note in flaky:
            self.say(f"kope {op.name}: {note}", red=True)

        def remember(j: Judged) -> None:  # at once, so a killed run resumes from every finished verdict
            for note in j.notes:
                if note.startswith("flaky test:") and note not in flaky:
                    flaky.append(note)
                    self.say(f"kope {op.name}: {note}", red=True)
            self.graph.record(task, self.run_id, j)
            self.config.hook.pytest_kope_candidate_judged(operator=op.name, result=j, config=self.config)

        p = _Progress(
            op,
            judge,
            info,
            hw,
            task,
            baseline,
            StopRule(self.budget, 0 if getattr(self.agent, "exhaustive", False) else self.patience, slot),
            remember,
        )
        if can_time:
            self._resume(p)
            self._search(p)
        else:
            p.rule.stop(Stop.NOT_TIMED, timer.why_not or "no performance test selected")
        why = p.rule.why or stopped(Stop.BUDGET)
        if why["reason"] != Stop.NOT_TIMED:
            self.say(f"kope {op.name}: search stopped: {why['detail']}")

        try:
            summary = self._conclude(
                op,
                judge,
                plan,
                baseline,
                p.incumbent,
                p.history,
                p.rule.evaluations,
                p.best_at,
                time.monotonic() - started,
                hw,
                task,
            )
            summary["flaky_tests"] = flaky  # the tests to fix, with the seeds that show it
            summary["seconds"] = round(time.monotonic() - started, 1)  # wall time, verification included
            summary["fixed_input_tests"] = baseline.fixed_inputs  # tests that make their own inputs
            summary["stopped"] = why
            return summary
        finally:
            for note in judge.notes:
                self.say(f"kope {op.name}: {note}", red=True)
            judge.close()

    def _resume(self, p: _Progress) -> None:
        """Judge the best known attempt of this operator's line again: the search starts from it."""
        op, task = p.op, p.task
        known = self.graph.best(task)
        prior = self.graph.judged(task, known["candidate_hash"]) if known else None
        if prior is not None and not self._may_run(prior.candidate, op.text):
            self.say(
                f"kope {op.name}: not resuming from {prior.candidate.short}: written by an agent, no jail here"
            )
            prior = None
        if prior is not None and self._descends(task, prior, p.baseline.candidate.hash):
            t0 = time.monotonic()
            again = self._judge_batch(p.judge, [prior.candidate], p.incumbent, True, p.remember)
            p.judged(again, time.monotonic() - t0)
            if again[0].outcome == Outcome.BETTER:
                self.say(
                    f"kope {op.name}: resuming from the known best {prior.candidate.short} "
                    f"({again[0].speedup:.2f}x)"
                )

    def _search(self, p: _Progress) -> None:
        """Propose, judge, remember, until the stop rule says stop (and why)."""
        op = p.op

        def seen(h: str) -> bool:
            return self.graph.lookup(p.task, h) is not None

        # An LLM's candidate may declare its own knobs: a tuner sweeps them within the same budget.
        sweeper = None
        if not isinstance(self.agent, Tuner):
            sweeper = Tuner(seed=self.config.stash[SEED], explore_rate=self.explore_rate)
        agents = [a for a in (self.agent, sweeper) if a is not None]
        stalls = 0
        while room := p.rule.room(self._batch()):
            left = self.budget - p.rule.evaluations
            ctx = Context(
                p.info, p.hw, p.baseline, p.incumbent, p.history, left, self._recaller(op, p.hw), seen
            )
            swept = (
                sweeper.propose(ctx, max(1, room // 2)) if sweeper and _declares_knobs(p.incumbent) else []
            )
            batch = swept + self.agent.propose(ctx, room - len(swept))
            known_verdicts = [v for c in batch if seen(c.hash) and (v := self.graph.judged(p.task, c.hash))]
            if known_verdicts:  # judged in an earlier run: the agents learn from the record, no re-run
                for agent in agents:
                    agent.observe(ctx, known_verdicts)
            batch = [c for c in batch if not seen(c.hash)]
            if not batch:
                stalls += 1
                done = getattr(self.agent, "done", None)  # the tuner says when it has converged
                if done or stalls >= 2:
                    p.rule.stop(*((Stop.CONVERGED, done) if done else _nothing_new(self.agent)))
                continue
            t0 = time.monotonic()
            judged = self._judge_batch(p.judge, batch, p.incumbent, True, p.remember)
            if not judged:  # the whole batch was lost to the machinery: the cluster is gone
                p.rule.stop(Stop.ERROR, f"infrastructure: {len(batch)} judgement(s) lost in a row")
                continue
            p.judged(judged, time.monotonic() - t0)
            self.graph.distill(p.task, self.run_id)
            for agent in agents:
                agent.observe(ctx, judged)
            per_minute = 60 * p.rule.evaluations / max(1e-9, time.monotonic() - p.started)
            self.say(
                f"kope {op.name}: {p.rule.evaluations}/{self.budget} evaluations, best "
                f"{p.incumbent.speedup:.2f}x ({p.incumbent.candidate.short}: {p.incumbent.candidate.idea}); "
                f"phase search, {per_minute:.1f} evaluations/min"
            )

    def _may_run(self, candidate: Candidate, committed: str) -> bool:
        """Code an agent wrote (any source but the committed one) runs only in the jail, or where the
        user allowed it without one."""
        return candidate.source == committed or self.allow_unjailed or bool(sandbox.bubblewrap()[0])

    def _descends(self, task: int, judged: Judged, root: str) -> bool:
        """Whether a recorded attempt was derived from `root` (resume only from the committed kernel's line)."""
        seen: set[str] = set()
        while judged is not None and judged.candidate.hash not in seen:
            seen.add(judged.candidate.hash)
            if judged.candidate.parent == root:
                return True
            parent = judged.candidate.parent
            judged = self.graph.judged(task, parent) if parent else None
        return False

    def _judge_batch(
        self, judge: Judge, batch: list[Candidate], incumbent: Judged, can_time: bool, remember
    ) -> list[Judged]:
        """Correctness for the batch in parallel, then each survivor timed against the then incumbent.
        A judgement lost to the machinery (`j.fault`) is left out: no verdict, no evaluation spent."""
        verdicts = self._judged_only(judge, judge.correctness(batch))
        if (
            len(judge.plan.devices) > 1 and can_time
        ):  # one timing worker per device, all against one incumbent
            survivors = [j for j in verdicts if j.outcome.correct]
            judge.performance_many(survivors, incumbent.candidate)
            survivors = self._judged_only(judge, survivors)
            verdicts = [j for j in verdicts if not j.fault]
            for j in survivors:
                self._decide(j, incumbent)
            winners = [j for j in survivors if j.outcome == Outcome.BETTER]
            fastest = max(winners, key=lambda w: w.speedup or 0.0, default=None)
            for j in winners:  # only the fastest becomes the incumbent
                if j is not fastest:
                    j.outcome = Outcome.OK
            for j in verdicts:
                remember(j)
            return verdicts
        for j in verdicts:
            if j.outcome.correct and can_time:
                judge.performance(j, incumbent.candidate)
                if j.fault:
                    self._fault(judge.plan.operator, j)
                    continue
                if self._decide(j, incumbent):
                    incumbent = j
            remember(j)
        return [j for j in verdicts if not j.fault]

    def _judged_only(self, judge: Judge, verdicts: list[Judged]) -> list[Judged]:
        for j in verdicts:
            if j.fault:
                self._fault(judge.plan.operator, j)
        return [j for j in verdicts if not j.fault]

    def _decide(self, j: Judged, incumbent: Judged) -> bool:
        """Set a timed candidate's speedup, and crown it BETTER when it beats the incumbent beyond noise."""
        if j.outcome == Outcome.SUSPECT or not j.timings:
            return False
        j.speedup = (incumbent.speedup or 1.0) * j.ratio
        if PairedRatio(j.ratio, j.ratio_low, j.ratio_low, len(j.timings)).beats(self.min_gain):
            j.outcome = Outcome.BETTER
            return True
        return False

    def _recaller(self, op: Operator, hw: dict):
        from .memory.recall import RecallQuery

        def recall(state: str = "", budget: int = 12):
            query = RecallQuery(
                operator=op.name,
                family=op.family,
                hardware=hw,
                toolchain=op.toolchain,
                state=state,
                max_items=budget if budget <= 100 else 12,
                max_tokens=budget if budget > 100 else None,
            )
            result = self.graph.recall(query)
            self.graph.mark_used(self.run_id, op.name, result)
            return result

        return recall

    def _conclude(
        self,
        op: Operator,
        judge: Judge,
        plan: Plan,
        baseline: Judged,
        incumbent: Judged,
        history: list[Judged],
        evaluations: int,
        evaluations_to_best: int,
        seconds: float,
        hw: dict,
        task: int,
    ) -> dict[str, Any]:
        verified = None
        branch = commit = None
        note = ""
        if incumbent is not baseline and not self.clock.can_verify():
            note = (
                f"not verified: the time budget ran out ({max(0.0, self.clock.left()):.0f} s left, "
                f"verifying takes about {self.clock.verify_s():.0f} s)"
            )
        elif incumbent is not baseline:
            verify_started = time.monotonic()
            self.say(
                f"kope {op.name}: verifying {incumbent.candidate.short} in a fresh process against the baseline"
            )
            judge.fresh_processes()  # independence over speed: a new process, a new build
            judge.baseline(baseline.candidate)  # the differential check on inputs never seen before
            fresh = judge.correctness([incumbent.candidate])[0]
            if fresh.outcome.correct:
                judge.performance(fresh, baseline.candidate)
            if fresh.outcome.correct and fresh.timings:
                ratio = PairedRatio(fresh.ratio, fresh.ratio_low, fresh.ratio_low, len(fresh.timings))
                verified = fresh if ratio.beats(self.min_gain) else None
                note = (
                    ""
                    if verified
                    else f"gain did not hold on re-run ({fresh.ratio:.2f}x, low {fresh.ratio_low:.2f})"
                )
            elif fresh.fault:  # lost to the machinery: not the candidate's failure
                self._fault(op, fresh)
                note = f"not verified: infrastructure fault: {fresh.fault[:300]}"
            else:
                note = f"failed verification: {fresh.outcome.value}: {(fresh.failures or fresh.notes or [''])[0][:300]}"
            self.clock.verifies.append(time.monotonic() - verify_started)
            if verified is not None:
                verified.speedup = verified.ratio
                if self.vcs is not None:
                    branch, commit, why = self._commit(op, verified, baseline, history, hw, plan.files)
                    note = why
                else:
                    note = f"verified, not committed: {self.no_commit_why}"
        best = verified or incumbent
        summary = report.operator_summary(
            op,
            baseline,
            best,
            verified is not None,
            evaluations,
            evaluations_to_best,
            history,
            branch,
            commit,
            note,
            seconds,
        )
        summary.update(self.publisher.after(op.name, summary))
        if note:
            self.say(f"kope {op.name}: {note}")
        return summary

    def _commit(
        self, op: Operator, verified: Judged, baseline: Judged, history: list[Judged], hw: dict, files: list
    ) -> tuple[str | None, str | None, str]:
        """Commit (never losing a commit), push and open the pull request: see publish.py."""
        return self.publisher.commit(op, verified, baseline, history, hw, files)

    # -- the end ---------------------------------------------------------------------------------
    def _finish(self) -> None:
        usage = _total_usage([self.agent, *self.agents])
        for agent in [self.agent, *self.agents]:
            if hasattr(agent, "close"):
                agent.close()
        if self.executor is not None:
            self.executor.close()
        self.graph.finish_run(self.run_id, usage)
        ceilings = self.graph.ceilings(self.hardware) if self.hardware else None
        data = {
            "run_id": self.run_id,
            "hardware": self.hardware,
            "hardware_name": label(self.hardware, ceilings) if self.hardware else "",
            "agent": self.agent_name,
            "budget": self.budget,
            "patience": self.patience,
            "explore_rate": self.explore_rate,
            "time_budget_minutes": self.clock.minutes,
            "seconds": round(self.clock.now() - self.clock.start, 1),
            "availability": self.availability,
            "isolation": sandbox.isolation_summary(),
            "usage": usage,
            "executor": self.executor_name,
            "concurrency": self.concurrency,
            "operators": [r.summary for r in self.operators.values()],
            "lessons": self._lessons_that_mattered(),
        }
        paths = report.write(self.run_dir, data, markdown(data), self.config.getoption("kope_report"))
        if self.tw is not None:
            self.tw.write_sep("=", "kope: results")
            self.tw.write_line(report.final_table(data["operators"]))
            self.tw.write_line(f"kope: report {paths[0]} and {paths[1]}")
            report.install_closing_line(self.tw, data["operators"])
        self.graph.checkpoint()  # the WAL folded into the file, so a CI cache of experience.db is whole
        self.graph.close()

    def _lessons_that_mattered(self) -> dict[str, list[dict[str, Any]]]:
        """Per operator, the lessons this run taught or confirmed, strongest evidence first."""
        from .memory.lessons import learned_in_run

        return {name: learned_in_run(self.graph, self.run_id, name) for name in self.operators}


def _total_usage(agents: list[Any]) -> dict[str, Any]:
    """The agents' usage summed (one agent per operator under --kope-concurrency): numbers add up,
    anything else is the first agent's."""
    total: dict[str, Any] = {}
    for agent in agents:
        for key, value in (agent.usage() if hasattr(agent, "usage") else {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key in total:
                total[key] += value
            else:
                total.setdefault(key, value)
    return total
