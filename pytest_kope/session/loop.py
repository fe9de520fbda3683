"""One operator's loop, read in order in `OperatorLoop.run`: the committed kernel judged (baseline),
then recall → propose → judge → remember until the stop rule says stop (decide.py crowns), then the
incumbent verified in fresh processes (verify.py), committed (commit.py) and summed up.

`OperatorLoop` runs one operator, with the judge's `Plan` that `planning.plan_for` makes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..agents.base import Agent, Context, OperatorInfo
from ..agents.tuner.agent import Tuner
from ..candidate import Candidate
from ..errors import BaselineBroken, InfrastructureFault, SpecError
from ..judge.controller import sandbox
from ..judge.controller.runner import Judge
from ..judge.outcome import Judged, Outcome
from ..memory import distill, recall_from
from ..settings import SEED
from ..spec import FLAGS, parse_spec
from ..stopping import Slot, Stop, StopRule, stopped
from .ceilings import remeasured_ceilings
from .commit import commit_winner, summed_up
from .decide import judge_batch, judged_only
from .planning import plan_for
from .progress import Progress
from .verify import Operand, verify_incumbent

if TYPE_CHECKING:
    from ..memory.recall import Recall
    from ..review.summary import OperatorSummary
    from .run import OperatorRun, Run


def _declares_knobs(judged: Judged) -> bool:
    """An incumbent written by an agent (not the tuner) that declares a tuning space of its own."""
    c = judged.candidate
    if c.agent in ("baseline", "tuner"):
        return False
    try:
        return bool(parse_spec(c.source, c.filename).space.axes)
    except SpecError:
        return False


class OperatorLoop:
    """One operator from baseline to summary; `run()` returns its summary for the report."""

    def __init__(self, s: Run, run: OperatorRun, slot: Slot | None):
        self.s, self.op, self.slot = s, run.op, slot
        self.started = time.monotonic()
        self.plan, self.tc = plan_for(s, run)
        self.judge = Judge(self.plan, self.tc.screen)
        self.judge.remeasure = lambda: remeasured_ceilings(s.ceilings, self.tc)
        self.timer = self.tc.timer()
        self.can_time = self.timer.can_time and bool(self.plan.performance)
        self.hw = self.tc.fingerprint()
        self.task = s.graph.task_id(self.op.name, self.op.family, self.op.toolchain, self.hw)
        self.flaky: list[str] = []
        self.progress: Progress | None = None  # the search so far: what an interrupted run reports
        self.operand = Operand(
            self.op, self.task, self.judge, self.plan, self.tc, self.hw, self.say, self.fault, self.started
        )

    def run(self) -> OperatorSummary:
        """Baseline, search, then verify and commit; the operator's summary. However it ends (an
        interruption too), the judge closes: its children, servers and temporary folders are gone."""
        try:
            baseline = self._baseline()
            info = self._info()
            rule = StopRule(self.s.settings.budget, self._patience(), self.slot, unexplored=self._unexplored)
            p = self.progress = Progress(baseline, rule)
            if self.can_time:
                self._resume(p)
                self._search(p, info)
            else:
                if self.s.agent.exhaustive:  # a list meant to be judged whole: `kope judge` on a CPU
                    self._correctness_only(p, info)
                p.rule.stop(Stop.NOT_TIMED, self.timer.why_not or "no performance test selected")
            why = p.rule.why or stopped(Stop.BUDGET)
            if why["reason"] != Stop.NOT_TIMED:
                self.say(f"search stopped: {why['detail']}")
            explored = self.s.agent.exploration(self.op.name)
            decided = {
                "flaky_tests": self.flaky,  # the tests to fix, with the seeds that show it
                "fixed_input_tests": baseline.fixed_inputs,  # tests that make their own inputs
                "stopped": why,
                # which axes the search tried around its incumbent, and which not
                "exploration": explored.to_json() if explored is not None else None,
                # the search itself failed: the run's status says so
                "search_failed": why["detail"] if why["reason"] == Stop.ERROR else None,
            }
            checked = verify_incumbent(self.s, self.operand, p)  # in fresh processes, as the file to commit
            winner, note = commit_winner(self.s, self.operand, p, checked)  # its branch, or its file
            return summed_up(self.s, self.operand, p, checked, winner, note, decided)
        finally:
            for note in self.judge.notes:
                self.say(note, red=True)
            self.judge.close()

    def say(self, line: str, red: bool = False) -> None:
        self.s.say(f"kope {self.op.name}: {line}", red=red)

    def _unexplored(self) -> list[str]:
        return self.s.agent.unexplored(self.op.name)

    def _patience(self) -> int:
        return 0 if self.s.agent.exhaustive else self.s.settings.patience

    def _baseline(self) -> Judged:
        """The committed kernel, judged and timed; it must pass its own tests."""
        op, judge = self.op, self.judge
        baseline = judge.baseline(op.baseline())
        if not baseline.outcome.correct:
            raise BaselineBroken(
                f"the committed kernel {op.source} fails its own correctness tests "
                f"({baseline.outcome.value}): {(baseline.failures or ['?'])[0][:500]}"
            )
        baseline.speedup = 1.0
        if baseline.fixed_inputs and len(baseline.fixed_inputs) == len(baseline.tests_passed):
            self.say(
                "correctness rests on fixed inputs: no test takes the `rng` fixture, so every "
                "candidate sees the inputs the tests make themselves; consider the `rng` fixture",
                red=True,
            )
        if self.can_time:
            judge.performance(baseline, baseline.candidate)
            if baseline.fault:
                raise InfrastructureFault(f"timing the committed kernel: {baseline.fault}")
            if baseline.outcome == Outcome.SUSPECT:  # every candidate at its speed would be suspect too
                self.say(
                    f"the committed kernel itself times faster than physics allows: {baseline.reason};"
                    " check the marker's flops= (never more than every correct kernel must do)",
                    red=True,
                )
        else:
            why = self.timer.why_not or "no performance test selected"
            self.say(f"not timing: {why}; nothing will be committed")
        baseline.outcome = Outcome.OK
        self.s.graph.record(self.task, self.s.run_id, baseline)
        self.s.clock.baselines.append(time.monotonic() - self.started)
        self.flaky = [n for n in baseline.notes if n.startswith("flaky test:")]
        for note in self.flaky:
            self.say(note, red=True)
        return baseline

    def _info(self) -> OperatorInfo:
        return self.op.info({str(f): f.read_text() for f in self.plan.files}, self.tc.screen)

    def remember(self, j: Judged) -> None:
        """At once, so a killed run resumes from every finished verdict."""
        for note in j.notes:
            if note.startswith("flaky test:") and note not in self.flaky:
                self.flaky.append(note)
                self.say(note, red=True)
        self.s.graph.record(self.task, self.s.run_id, j)
        self.s.config.hook.pytest_kope_candidate_judged(operator=self.op.name, result=j, config=self.s.config)

    def fault(self, j: Judged) -> None:
        """A judgement lost to the machinery (`j.fault`): reported, no verdict recorded."""
        self.s.concurrency.fault(self.op.name, j)

    def _judge(self, p: Progress, batch: list[Candidate]) -> list[Judged]:
        """The batch judged and counted; judgements lost to the machinery are left out."""
        t0 = time.monotonic()
        min_gain = self.s.settings.min_gain
        batch = [self._held(c) for c in batch]
        judged = judge_batch(self.judge, batch, p.incumbent, min_gain, self.remember, self.fault)
        if judged:
            p.judged(judged, time.monotonic() - t0)
        return judged

    def _held(self, candidate: Candidate) -> Candidate:
        """`candidate` with a `flags` value the repo's own build takes, when it builds the kernel
        itself (`Operator.searched_space`): a value with no source form on its compiler is replaced
        by the build's own, whatever an agent asked for, so the judge measures what a merge delivers."""
        searched = self.op.searched_space.axes.get(FLAGS)
        if not self.op.own_build or searched is None or candidate.params.get(FLAGS, searched[0]) in searched:
            return candidate
        return replace(candidate, params={**candidate.params, FLAGS: searched[0]})

    def _say_flags(self) -> None:
        """How the `flags` axis reaches a kernel the repo builds itself, and, in one line, the values
        with no source form on its compiler (not searched)."""
        compiler, unsearched = self.op.flags_unsearched()
        if not compiler:
            flags = self.op.searched_space.axes[FLAGS][0]
            self.say(
                f"compiler flags held at {flags!r}: the repo builds this kernel with {self.op.own_build}"
            )
            return
        self.say(
            f"compiler flags carried in the source for {compiler}: the repo builds this kernel with "
            f"{self.op.own_build}, so each `flags` value is searched as the pragmas and target clones "
            "written into the file it commits"
        )
        if unsearched:
            self.say(f"flags with no source form on {compiler}, not searched: {'; '.join(unsearched)}")

    def _resume(self, p: Progress) -> None:
        """Judge the best known attempt of this operator's line again: the search starts from it.
        That is where the latest search ended (its winner), else the fastest correct attempt."""
        graph, root = self.s.graph, p.baseline.candidate.hash
        prior = None
        for known in (graph.incumbent(self.task), graph.best(self.task)):  # the latest may be another line's
            found = graph.judged(self.task, known["candidate_hash"]) if known else None
            if found is not None and self._descends(found, root):
                prior = found
                break
        if prior is not None and not self._may_run(prior.candidate):
            self.say(f"not resuming from {prior.candidate.short}: written by an agent, no jail here")
            prior = None
        if prior is not None:
            again = self._judge(p, [prior.candidate])
            if again and again[0].outcome == Outcome.BETTER:
                self.say(f"resuming from the known best {prior.candidate.short} ({again[0].speedup:.2f}x)")

    def _may_run(self, candidate: Candidate) -> bool:
        """Code an agent wrote (any source but the committed one) runs only in the jail, or where the
        user allowed it without one."""
        return (
            candidate.source == self.op.text
            or self.s.settings.allow_unjailed
            or bool(sandbox.bubblewrap()[0])
        )

    def _descends(self, judged: Judged | None, root: str) -> bool:
        """Whether a recorded attempt was derived from `root` (resume only from the committed kernel's line)."""
        seen: set[str] = set()
        while judged is not None and judged.candidate.hash not in seen:
            seen.add(judged.candidate.hash)
            if judged.candidate.parent == root:
                return True
            parent = judged.candidate.parent
            judged = self.s.graph.judged(self.task, parent) if parent else None
        return False

    def _seen(self, h: str) -> bool:
        return self.s.graph.lookup(self.task, h) is not None

    def _search(self, p: Progress, info: OperatorInfo) -> None:
        """Recall, propose, judge, remember, until the stop rule says stop (and why)."""
        s, agent = self.s, self.s.agent
        if self.op.own_build and FLAGS in self.op.spec.space.axes:
            self._say_flags()
        # An LLM's candidate may declare its own knobs: a tuner sweeps them within the same budget.
        sweeper = None
        if not agent.tunes_spaces:
            sweeper = Tuner(seed=s.config.stash[SEED], explore_rate=s.settings.explore)
        agents = [a for a in (agent, sweeper) if a is not None]
        stalls = proposed = 0
        while room := p.rule.room(s.batch()):
            left = s.settings.budget - p.rule.evaluations
            ctx = Context(
                info, self.hw, p.baseline, p.incumbent, p.history, left, self.recaller(), self._seen,
                self._propose_by(room),
            )  # fmt: skip
            swept = (
                sweeper.propose(ctx, max(1, room // 2)) if sweeper and _declares_knobs(p.incumbent) else []
            )
            batch = swept + agent.propose(ctx, room - len(swept))
            self.s.children.check_stopping()  # Ctrl-C during the agent's round: its call is closed, no round follows
            proposed += len(batch)
            known = [v for c in batch if self._seen(c.hash) and (v := s.graph.judged(self.task, c.hash))]
            if known:  # judged in an earlier run: the agents learn from the record, no re-run
                for a in agents:
                    a.observe(ctx, known)
            batch = [c for c in batch if not self._seen(c.hash)]
            if not batch:
                stalls += 1
                done = agent.done  # the tuner says when it has converged
                if done or stalls >= 2:
                    p.rule.stop(*((Stop.CONVERGED, done) if done else self._nothing_new(agent, proposed)))
                continue
            judged = self._judge(p, batch)
            if not judged:  # the whole batch was lost to the machinery: the cluster is gone
                p.rule.stop(Stop.ERROR, f"infrastructure: {len(batch)} judgement(s) lost in a row")
                continue
            distill(s.graph, self.task, s.run_id)
            for a in agents:
                a.observe(ctx, judged)
            self._progress_line(p)

    def _propose_by(self, room: int) -> float | None:
        """When the agent's proposals must be in (--kope-time-budget; the clock is time.monotonic's)."""
        if self.slot is None:
            return None
        return self.slot.propose_by(room)

    def _correctness_only(self, p: Progress, info: OperatorInfo) -> None:
        """Where nothing can be timed, candidates of an agent whose list is meant to be judged whole
        (replay: hand-written files, `kope judge` with a Triton file on a CPU, in the interpreter)
        still get their correctness verdict, `ok` or a failure, up to the budget; none is timed,
        crowned or committed, and the stop reason stays `not timed`."""
        s, agent = self.s, self.s.agent
        while (left := s.settings.budget - p.rule.evaluations) > 0:
            ctx = Context(
                info, self.hw, p.baseline, p.incumbent, p.history, left, self.recaller(), self._seen
            )
            batch = [c for c in agent.propose(ctx, min(s.batch(), left)) if not self._seen(c.hash)]
            if not batch:
                return
            began = time.monotonic()
            judged = judged_only(self.judge.correctness([self._held(c) for c in batch]), self.fault)
            for j in judged:
                self.remember(j)
            p.judged(judged, time.monotonic() - began)
            agent.observe(ctx, judged)
            if not judged:
                return

    def _nothing_new(self, agent: Agent, proposed: int) -> tuple[Stop, str]:
        """Why an agent proposed nothing: done, or, when it never proposed a candidate for this
        operator and reported faults (an unreachable API, a refused key), an error naming the first."""
        name, usage, spent = agent.name, agent.usage(), agent.stopped_for(self.op.name)
        if spent:  # its token budget for this operator (--kope-max-tokens): a clean stop
            return (Stop.AGENT_DONE if proposed else Stop.ERROR), spent
        mine = [f for f in usage.get("faults", []) if str(f).startswith(f"{self.op.name}: ")]
        if proposed or not mine:
            return Stop.AGENT_DONE, f"the {name} agent proposed nothing new"
        first = mine[0].removeprefix(f"{self.op.name}: ")
        self.say(f"the {name} agent proposed no candidate: {first}", red=True)
        return (
            Stop.ERROR,
            f"the {name} agent proposed no candidate ({len(mine)} fault(s)); the first: {first}",
        )

    def _progress_line(self, p: Progress) -> None:
        per_minute = 60 * p.rule.evaluations / max(1e-9, time.monotonic() - p.started)
        inc = p.incumbent
        self.say(
            f"{p.rule.evaluations}/{self.s.settings.budget} evaluations, best so far "
            f"~{inc.speedup:.2f}x (search estimate, before verification) ({inc.candidate.short}: {inc.candidate.idea}); "
            f"phase search, {per_minute:.1f} evaluations/min"
        )

    def recaller(self) -> Callable[..., Recall]:
        """`recall(state=..., budget=...)` for the agent: items (budget <= 100) or tokens (more)."""
        from ..memory.recall import RecallQuery

        op, graph, run_id, hw = self.op, self.s.graph, self.s.run_id, self.hw

        def recall(state: str = "", budget: int = 12, points: bool = False) -> Recall:
            query = RecallQuery(
                operator=op.name,
                family=op.family,
                hardware=hw,
                toolchain=op.toolchain,
                state=state,
                max_items=budget if budget <= 100 else 12,
                max_tokens=budget if budget > 100 else None,
                points=points,  # past attempts' params and speedups, for the tuner's effect model
            )
            result = recall_from(graph, query)
            graph.mark_used(run_id, op.name, [lesson.id for lesson in result.lessons])
            return result

        return recall
