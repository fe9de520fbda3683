"""Where judging children run and how many operators run at once (`--kope-executor`,
`--kope-concurrency`, `--kope-ray-repo`): starting the executor, each operator's own view of the
session, the shared node and timing slots in its plan, and judgements lost to the machinery.

The executors themselves live in judge/controller/executors.py and judge/controller/ray_executor.py, the operator threads in
scheduler.py; this module is the session's side of them.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..agents.base import Agent, declared
from ..errors import ConfigError, KopeError
from ..judge.controller.plan import Executor, NodeReservation, Plan
from ..judge.outcome import Judged
from ..scheduler import one_at_a_time
from ..settings import Settings
from ..toolchains import toolchain_of
from .ceilings import CeilingProbe, measure_ceilings

if TYPE_CHECKING:
    from ..memory import Graph
    from ..review.publish import Publisher


class Concurrency:
    """The run's executor, node reservation, shared timing slots and infrastructure faults."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.executor: Executor | None = None  # None judges on this machine
        self.node = NodeReservation() if settings.concurrency > 1 else None
        self.timing_slots: dict[tuple[int, ...], queue.Queue[int | None]] = {}
        self.faults: dict[str, list[str]] = {}  # operator -> judgements lost to the machinery
        self.agents: list[Agent] = []  # each operator's own agent under --kope-concurrency
        self.lock = threading.Lock()
        self.say: Callable[..., None] = lambda line, red=False: None

    @property
    def many(self) -> bool:
        """Whether operators run at once (in threads of their own)."""
        return self.settings.concurrency > 1

    def start(
        self, graph: Graph, publisher: Publisher, home: Path, say: Callable[..., None]
    ) -> tuple[Settings, Graph, Publisher]:
        """Connect to Ray for `--kope-executor ray`; with operators at once, the graph and the
        publisher take calls one at a time (the controller stays their only writer). Returns the
        settings (the cluster's cores as correctness workers), graph and publisher the run uses."""
        from ..judge.controller.ray_executor import make_executor

        s, self.say = self.settings, say
        if self.many:
            graph, publisher = one_at_a_time(graph), one_at_a_time(publisher)
        self.executor = make_executor(s.executor, home, ship=s.ray_repo == "ship")
        if self.executor is not None:
            self.node = None  # the executor reserves nodes and devices (Ray resources)
            if not s.jobs_given:  # correctness workers: the cluster's cores
                s = self.settings = dataclasses.replace(s, jobs=self.executor.cpus())
            say(f"kope: executor {self.executor.describe()}")
        if self.many:
            say(f"kope: {s.concurrency} operators at once, each with its own budget")
        return s, graph, publisher

    def own_agent(self, config: pytest.Config, agent: Agent) -> Agent:
        """The agent one operator uses. Under --kope-concurrency a new one of the same kind (an agent's
        search state is per operator), reporting to the same sinks; otherwise the run's."""
        if not self.many:
            return agent
        made = config.hook.pytest_kope_make_agent(name=self.settings.agent, config=config)
        own = declared(made, self.settings.agent)
        own.graph_sink, own.prompt_sink, own.line_sink = agent.graph_sink, agent.prompt_sink, agent.line_sink
        self.agents.append(own)
        return own

    def measure_ceilings_once(self, probe: CeilingProbe, config: pytest.Config, toolchains: set[str]) -> None:
        """The machine's ceilings, measured before the operators start at once (never twice at a time)."""
        if not self.many:
            return
        for name in sorted(toolchains):
            try:
                measure_ceilings(probe, toolchain_of(config, name))
            except Exception:  # noqa: BLE001 - the operator that needs it meets the same error and says it
                pass

    def share(self, plan: Plan) -> Plan:
        """`plan` with the run's executor and node; checks the executor can judge it, or, with operators
        at once on this machine, shares one queue of timing devices between them."""
        plan = dataclasses.replace(plan, executor=self.executor, node=self.node)
        if self.executor is not None:
            try:
                self.executor.require(plan)
            except ConfigError as e:  # this operator cannot be judged there; the others go on
                raise KopeError(str(e)) from None
        elif self.many:  # one device (or the CPU) times one operator's candidate at a time
            with self.lock:
                if plan.devices not in self.timing_slots:
                    slots: queue.Queue[int | None] = queue.Queue()
                    for device in plan.devices or (None,):
                        slots.put(device)
                    self.timing_slots[plan.devices] = slots
            plan = dataclasses.replace(plan, timing_slots=self.timing_slots[plan.devices])
        return plan

    def fault(self, operator: str, j: Judged) -> None:
        """A judgement lost to the machinery: reported, never recorded as the candidate's verdict."""
        self.faults.setdefault(operator, []).append(f"{j.candidate.short}: {j.fault}")
        self.say(
            f"kope {operator}: infrastructure fault, {j.candidate.short} not judged: {j.fault}", red=True
        )

    def close(self, main_agent: Agent) -> dict[str, Any]:
        """Close every agent and the executor; the agents' usage summed."""
        agents = [main_agent, *self.agents]
        usage = total_usage(agents)
        for agent in agents:
            agent.close()
        if self.executor is not None:
            self.executor.close()
        return usage


def total_usage(agents: list[Agent]) -> dict[str, Any]:
    """The agents' usage summed (one agent per operator under --kope-concurrency): numbers add up,
    lists (faults, retries, notes) join, dicts (per_operator) merge, anything else is the first agent's."""
    total: dict[str, Any] = {}
    for agent in agents:
        for key, value in agent.usage().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key in total:
                total[key] += value
            elif isinstance(value, list) and isinstance(total.get(key), list):
                total[key] = total[key] + value
            elif isinstance(value, dict) and isinstance(total.get(key), dict):
                total[key] = {**total[key], **value}
            else:
                total.setdefault(key, value)
    return total
