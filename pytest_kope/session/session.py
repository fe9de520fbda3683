"""The optimize-mode plugin: pytest's hooks for one run. It opens the graph, makes the agent, hands each
operator to its loop (loop.py), and writes the report at the end.

Registered as the `KopeSession` plugin only under `--kope-optimize` (or `--kope-check`); it replaces the
test run loop. Every hook runs its work inside `border()`, where a KopeError becomes a usage error.
"""

from __future__ import annotations

import datetime
import threading
import uuid
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ..agents.base import declared
from ..errors import ConfigError, Interrupted, KopeError
from ..hardware import label
from ..judge.controller import isolation, sandbox
from ..memory.opening import GraphGuard
from ..operator import operator_of, same_operator
from ..paths import ensure_kope_dir, kope_home
from ..review import report, report_formats
from ..review.summary import OperatorSummary
from ..scheduler import each
from ..settings import Settings
from ..stopping import RunClock, Slot, Stop, stopped
from ..toolchains import toolchain_of
from .border import border
from .ceilings import CeilingProbe
from .concurrency import Concurrency
from .interrupt import Interruption, interrupted_summary, not_started
from .loop import OperatorLoop
from .run import OperatorRun, Run
from .runlock import RunLock, say_others


class KopeSession:
    """The optimize-mode plugin: owns the graph, the agent, the judge and the report."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        with border():
            self.settings = Settings.from_config(config)
        self.clock = RunClock(self.settings.minutes)
        self.since_line = ""
        self.operators: OrderedDict[str, OperatorRun] = OrderedDict()
        self.tw: Any = None
        self.output = threading.Lock()  # operators at once write whole lines to the terminal
        self.concurrency = Concurrency(self.settings)  # the executor, operators at once (concurrency.py)
        self.run_lock: RunLock | None = None  # this repo's one optimize run at a time (runlock.py)
        self.children = sandbox.Children()  # every child the run starts: its plans carry it, Ctrl-C kills it
        self.interruption = Interruption(None, self.children)  # Ctrl-C and SIGTERM (interrupt.py)
        self.graph_guard = GraphGuard(self.say)  # a damaged graph moved aside; SQLite errors in one line

    def say(self, line: str, red: bool = False) -> None:
        if self.tw is not None:
            with self.output:
                self.tw.write_line(line, red=red)

    # -- pytest hooks --------------------------------------------------------------------------
    def pytest_configure(self, config: pytest.Config) -> None:
        name = self.settings.agent
        with border():
            made = config.hook.pytest_kope_make_agent(name=name, config=config)
            if made is None:
                raise ConfigError(
                    f"--kope-agent {name}: no such agent (auto, tuner, claude[:MODEL], openai:MODEL, replay:DIR)"
                )
            self.agent = declared(made, name)
            # Candidates that are new code (any agent but the tuner, which only rebuilds the committed
            # source) run only in the jail unless the user says otherwise.
            isolation.require_jail(self.agent.name, not self.agent.needs_jail or self.settings.allow_unjailed)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        with border():
            if self.settings.operators:
                self._only(config, items)
            self._group(items)

    def _only(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """--kope-operator: the other operators' tests are deselected (not-kope tests stay: none is
        judged); a name no collected operator has is an error that lists the ones there are."""
        found = {op.name for op in map(operator_of, items) if op is not None}
        if missing := [n for n in self.settings.operators if n not in found]:
            raise ConfigError(
                f"--kope-operator {missing[0]}: no such operator collected here"
                f" (found: {', '.join(sorted(found)) or 'none'}); give the `kope` marker's name"
            )
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            op = operator_of(item)
            (dropped if op is not None and op.name not in self.settings.operators else kept).append(item)
        if dropped:
            items[:] = kept
            config.hook.pytest_deselected(items=dropped)

    @pytest.hookimpl(wrapper=True, specname="pytest_collection_modifyitems")
    def pytest_collection_modifyitems_since(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        """--kope-since REF: narrow (or, with -k, widen) the operators to those changed since REF.
        (Named pytest_* with a specname: pytest reads hook options only from pytest_* names.)"""
        before = list(items)
        yield
        if not self.settings.since:
            return
        from ..since import select

        with border():
            items[:], self.since_line = select(
                config.rootpath,
                self.settings.since,
                before,
                items,
                bool(config.option.keyword),
                lambda dropped: config.hook.pytest_deselected(items=dropped),
            )
            self.operators.clear()
            self._group(items)

    def _group(self, items: list[pytest.Item]) -> None:
        for item in items:
            op = operator_of(item)
            if op is not None:
                run = self.operators.setdefault(op.name, OperatorRun(op, []))
                same_operator(run.op, run.items[0].nodeid if run.items else "", op, item.nodeid)
                run.items.append(item)

    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.config.option.collectonly:
            return False
        self.tw = session.config.pluginmanager.get_plugin("terminalreporter")
        if not self.settings.check_only:
            with Interruption(self.tw, self.children) as self.interruption:
                self._optimize(session)
            return True
        with border(), self.graph_guard.failing():
            self._start()
        from ..doctor import check

        session.testsfailed = check(self.run, list(self.operators.values()))
        self.run.graph.close()
        return True

    def _optimize(self, session: pytest.Session) -> None:
        """The optimize run. Interrupted (interrupt.py), it still writes the report of what was done,
        each unfinished operator `interrupted`, and pytest's status is 2."""
        stop = self.interruption
        try:
            with border(), self.graph_guard.failing():
                self._start()
        except Interrupted:  # while it waited for another run of this repo: nothing was started
            session.shouldstop = f"kope: interrupted by {stop.why} while waiting; nothing was started"
            return
        runs = list(self.operators.values())
        try:
            toolchains = {run.op.toolchain for run in runs}
            self.concurrency.measure_ceilings_once(self.run.ceilings, self.config, toolchains)
            each(runs, self._operator, self.run.settings.concurrency)
        except Interrupted:
            pass  # each operator's summary says where the interruption found it
        if stop.why:
            not_started(runs)
            for run in runs:
                self._done(run)
        session.testsfailed = sum(run.summary is not None and run.summary.failed for run in runs)
        self._finish()
        if stop.why:
            session.shouldstop = stop.ending()  # pytest's closing "stopped" line
        if self.run_lock is not None:
            self.run_lock.release()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.interruption.why:  # pytest's own status for an interrupted session
            session.exitstatus = pytest.ExitCode.INTERRUPTED

    def pytest_unconfigure(self) -> None:
        self.interruption.close()
        if self.run_lock is not None:  # also when the run ended on an error after taking it
            self.run_lock.release()

    def _operator(self, run: OperatorRun, left: int) -> None:
        """One operator from baseline to commit; `left`: operators not started yet, this one included.
        Under --kope-concurrency each runs in a thread of its own, with its own agent (`Concurrency.own_agent`)."""
        # an operator's minimum: one round that keeps each correctness worker busy once
        clock = self.run.clock
        slot = clock.slot(left, self.run.settings.jobs) if clock.limited else None
        try:
            run.summary = self._one(run, slot)
        finally:  # interrupted, `_one` left where the interruption found it in `run.summary`
            if run.summary is not None:
                faults = self.concurrency.faults.get(run.op.name)
                if faults:
                    run.summary = replace(run.summary, infrastructure_faults=faults)
                self._done(run)

    def _done(self, run: OperatorRun) -> None:
        """`pytest_kope_operator_done`, once for each operator the report holds: one that ended, one
        the interruption found unfinished or kept from starting. The hook's `summary` is a plain dict,
        report.json's entry: a contract with users' plugins."""
        if run.summary is not None and not run.told:
            run.told = True
            self.config.hook.pytest_kope_operator_done(
                operator=run.op.name, summary=run.summary.to_json(), config=self.config
            )

    def _one(self, run: OperatorRun, slot: Slot | None) -> OperatorSummary:
        """Optimize one operator; its summary (`error` set when it stopped on one). Interrupted, it
        leaves in `run.summary` where the interruption found it, and raises on."""
        name = run.op.name
        if self.run.clock.limited and slot is None:
            why = f"the time budget ({self.run.clock.minutes:g} min) ran out before it began"
            self.say(f"kope {name}: not started: {why}")
            return OperatorSummary(name=name, verified=False, stopped=stopped(Stop.NOT_REACHED, why))
        loop = None
        try:
            with self.graph_guard.failing():
                own = replace(self.run, agent=self.concurrency.own_agent(self.config, self.run.agent))
                loop = OperatorLoop(own, run, slot)
                return loop.run()
        except Interrupted:
            run.summary = interrupted_summary(name, loop)
            raise
        except KopeError as e:  # BaselineBroken, an unavailable toolchain, no correctness tests
            self.say(f"kope {name}: STOPPED: {e}", red=True)
            return OperatorSummary(
                name=name, error=str(e), verified=False, stopped=stopped(Stop.ERROR, str(e))
            )

    # -- setup -----------------------------------------------------------------------------------
    def _start(self) -> None:
        """Open the run (`_open_run`), say what is available, and record the run's start in the graph.
        From here on the run's parts are read from `self.run` only."""
        run = self.run = self._open_run()
        if self.since_line:
            self.say(self.since_line)
        s = run.settings
        if s.check_only:  # nothing is optimized: no agent, no budget to speak of
            self.say(f"kope: check {self.run_id}, {len(self.operators)} operator(s)")
        else:
            self.say(
                f"kope: run {self.run_id}, agent {s.agent} ({run.agent.name}), budget {s.budget} "
                f"evaluations per operator, {len(self.operators)} operator(s)"
            )
            if run.no_commit_why:
                self.say(
                    f"kope: winners will not be committed ({run.no_commit_why}): each verified winner's "
                    f"file goes to {run.run_dir}/<operator>/"
                )
        self._toolchains()
        for line in isolation.isolation_summary():
            self.say(f"kope: isolation: {line}")
        hw: dict[str, Any] = {}
        for op_run in self.operators.values():
            hw = toolchain_of(self.config, op_run.op.toolchain).fingerprint()
            break
        self.hardware = hw
        if hw:
            self.say(f"kope: hardware: {label(hw, run.graph.ceilings(hw))}")
        if run.clock.limited:
            self.say(
                f"kope: time budget {run.clock.minutes:g} min for the whole run, shared by the operators"
            )
        run.graph.start_run(self.run_id, s.agent, hw)
        # an LLM agent reports every call's tokens to the graph, and every prompt it opens a round
        # with to the run folder, for audit (other agents never call them)
        from ..agents.llm.record import write

        graph, run_dir = run.graph, run.run_dir
        run.agent.graph_sink = lambda op, model, used: graph.record_llm_call(self.run_id, op, model, used)
        run.agent.prompt_sink = lambda made: write(run_dir, made).relative_to(run_dir)
        run.agent.line_sink = self.say
        self.interruption.also.append(self._cancel_agents)  # Ctrl-C ends their model calls too

    def _cancel_agents(self, why: str) -> None:
        """The run's agents (one per operator at once) end what they have in flight: no lock taken."""
        for agent in (self.run.agent, *self.concurrency.agents):
            agent.cancel(why)

    def _open_run(self) -> Run:
        """The run's home, `.kope/` (and this repo's run lock), the graph, the run folder, git, the
        publisher and the executor, as one `Run`."""
        from ..review.publish import Publisher
        from ..review.vcs import Vcs

        s = self.settings
        home, warning = kope_home(
            Path(str(self.config.rootpath)), [r.op.source for r in self.operators.values()]
        )
        if warning:
            self.say(f"kope: {warning}", red=True)
        base = ensure_kope_dir(home / ".kope")
        if not s.check_only:  # `kope doctor` changes nothing: it needs no lock
            self.run_lock = RunLock(base, self.run_id, home)
            self.run_lock.acquire(wait=not s.no_wait, say=self.say, stopping=self.children)
            say_others(self.run_lock.others_on_machine(), lambda line: self.say(line, red=True))
        graph = self.graph_guard.open(Path(s.db) if s.db else base / "experience.db")
        run_dir = base / "runs" / self.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        vcs = None if s.no_commit else Vcs.find(home)
        no_commit_why = "--kope-no-commit" if s.no_commit else "" if vcs else f"no git repository at {home}"
        if vcs is not None:
            for path in vcs.prune_stale_worktrees():
                self.say(f"kope: removed a worktree a killed run left behind: {path}")
        publisher = Publisher(self.config, vcs, self.run_id, s.prefix, run_dir, graph)
        publisher.say = self.say
        settings, graph, publisher = self.concurrency.start(graph, publisher, home, self.say)
        return Run(
            config=self.config,
            run_id=self.run_id,
            settings=settings,
            clock=self.clock,
            home=home,
            kope_base=base,
            run_dir=run_dir,
            graph=graph,
            vcs=vcs,
            no_commit_why=no_commit_why,
            publisher=publisher,
            agent=self.agent,
            concurrency=self.concurrency,
            ceilings=CeilingProbe(graph, base / "builds", self.say),
            children=self.children,
            say=self.say,
        )

    def _toolchains(self) -> None:
        """Which toolchains work here, and why not (for the report)."""
        hook = self.config.hook.pytest_kope_toolchain_names
        names = sorted({n for names in hook(config=self.config) for n in names})
        self.availability: dict[str, dict[str, Any]] = {}
        for name in names:
            try:
                a = toolchain_of(self.config, name).availability()
                self.availability[name] = {"available": a.ok, "reason": a.reason}
            except Exception as e:  # a broken optional toolchain must not stop the C one
                self.availability[name] = {"available": False, "reason": f"{type(e).__name__}: {e}"}
            state = "available" if self.availability[name]["available"] else "unavailable"
            self.say(f"kope: toolchain {name}: {state}: {self.availability[name]['reason']}")

    # -- the end ---------------------------------------------------------------------------------
    def _finish(self) -> None:
        run = self.run
        usage = run.concurrency.close(run.agent)
        with self.graph_guard.surviving():  # a graph failing now must not cost the run its report
            run.graph.finish_run(self.run_id, usage)
        summaries = [r.summary for r in self.operators.values() if r.summary is not None]
        data = self._report_data(usage, summaries)
        paths = report_formats.write(run.run_dir, data, run.settings.report)
        if self.tw is not None:
            self.tw.write_sep("=", "kope: results")
            self.tw.write_line(report.final_table(summaries))
            self.tw.write_line(f"kope: report {report_formats.said(paths)}")
            report.install_closing_line(self.tw, summaries)
        with self.graph_guard.surviving():
            run.graph.checkpoint()  # the WAL folded into the file, so a CI cache of experience.db is whole
        run.graph.close()

    def _report_data(self, usage: dict[str, Any], summaries: list[OperatorSummary]) -> dict[str, Any]:
        """report.json's data, what every report format renders (`report_formats.FORMATS`)."""
        from ..memory.lessons import learned_in_run

        run, s = self.run, self.run.settings
        ceilings, lessons = None, {}
        with self.graph_guard.surviving():
            ceilings = run.graph.ceilings(self.hardware) if self.hardware else None
            # per operator, the lessons this run taught or confirmed, strongest evidence first
            lessons = {name: learned_in_run(run.graph, self.run_id, name) for name in self.operators}
        return {
            "run_id": self.run_id,
            "hardware": self.hardware,
            "hardware_name": label(self.hardware, ceilings) if self.hardware else "",
            "agent": s.agent,
            "budget": s.budget,
            "patience": s.patience,
            "explore_rate": run.settings.explore,
            "time_budget_minutes": run.clock.minutes,
            "seconds": round(run.clock.now() - run.clock.start, 1),
            "availability": self.availability,
            "isolation": isolation.isolation_summary(),
            "usage": usage,
            "executor": s.executor,
            "concurrency": s.concurrency,
            "operators": [o.to_json() for o in summaries],
            "lessons": lessons,
        }
