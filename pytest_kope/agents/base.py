"""What an agent is: it proposes candidates for one operator and hears how they were judged.

Agents are made by the `pytest_kope_make_agent` hook: `tuner`, `claude[:MODEL]`, `openai:MODEL` and `replay:DIR` are built in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..candidate import Candidate
from ..errors import ConfigError
from ..judge.outcome import Judged
from ..memory.recall import Recall
from ..spec import TuningSpace
from .tuner.exploration import Exploration


@dataclass
class OperatorInfo:
    """What an agent may know of the operator (never the oracle's internals beyond the test source)."""

    name: str
    family: str
    toolchain: str
    filename: str  # e.g. softmax.c
    source: str  # the committed kernel source
    space: TuningSpace  # declared by the committed source
    kernels: tuple[str, ...]  # declared kernel prototypes: the contract a candidate must keep
    tests: dict[str, str] = field(default_factory=dict)  # test file path -> source text
    # the toolchain's own source screen (Toolchain.screen), for agents that check a draft before
    # submitting it; None: no early check (the judge screens every candidate anyway)
    screen: Callable[[Candidate], list[str]] | None = None


@dataclass
class Context:
    """One operator's state, handed to the agent before each proposal round."""

    operator: OperatorInfo
    hardware: dict[str, Any]
    baseline: Judged  # the committed kernel, judged; its timings are the reference
    incumbent: Judged  # best verified so far (the baseline at first)
    history: list[Judged]  # everything judged for this operator in this run, in order
    budget_left: int  # evaluations left for this operator
    recall: Callable[..., Recall | None]  # recall(state=..., budget=...)
    seen: Callable[[str], bool]  # is a candidate hash already in the graph for this task?
    # when this round's proposals must be in (time.monotonic()), so that what they propose can still
    # be judged and a winner verified within --kope-time-budget; None: no time budget
    deadline: float | None = None


Sink = Callable[[str, str, dict[str, int]], None]  # (operator, model, tokens used) of one LLM call
PromptSink = Callable[[dict[str, Any]], object]  # a prompt or call record, for the run folder
LineSink = Callable[[str], object]  # one line for the terminal (a long model call's progress)


@runtime_checkable
class Agent(Protocol):
    """What proposes candidates, made by `pytest_kope_make_agent`: everything the run asks of an
    agent is declared here (subclass `AgentBase` for the defaults), never probed for."""

    name: str
    needs_jail: bool  # its candidates are untrusted code: judged only in the bubblewrap jail
    exhaustive: bool  # a fixed list meant to be judged whole (replay): --kope-patience does not stop it
    tunes_spaces: bool  # it tunes declared knobs itself; else a tuner sweeps its candidates' knobs
    done: str | None  # why the last empty proposal ended the search (it converged), else None
    graph_sink: Sink | None  # set by the session: where an LLM agent records each call's tokens
    prompt_sink: PromptSink | None  # set by the session: where each prompt, request and reply is recorded
    line_sink: LineSink | None  # set by the session: where a long call's progress is said

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        """Up to `n` new candidates; an empty list means the agent has nothing more to try (`done`
        says why when it has converged)."""

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        """The verdicts on the last proposals (in the order proposed)."""

    def usage(self) -> dict[str, Any]:
        """Cost so far for the report: e.g. calls, input/output/cache tokens, faults seen."""

    def stopped_for(self, operator: str) -> str | None:
        """Why it proposes nothing more for `operator` (e.g. its token budget is spent), or None."""

    def unexplored(self, operator: str) -> list[str]:
        """The axes nothing in the graph speaks for that it has not explored around the incumbent:
        while there are any, no gain in N evaluations does not stop the search."""

    def exploration(self, operator: str) -> Exploration | None:
        """For the report: the axes known from the graph, explored, and never explored."""

    def cancel(self, why: str) -> None:
        """Ctrl-C (`why`: the signal's name): end what is in flight now (a model call) and propose
        nothing more. Called from a signal handler: it must take no lock."""

    def close(self) -> None:
        """Release what it holds (an HTTP client): the run is over."""


class AgentBase:
    """The defaults of `Agent`: an agent whose candidates are new code, judged in the jail, with no
    cost, no exploration bookkeeping and nothing to release. Subclass it and override what differs."""

    name = "agent"
    needs_jail = True
    exhaustive = False
    tunes_spaces = False
    done: str | None = None
    graph_sink: Sink | None = None
    prompt_sink: PromptSink | None = None
    line_sink: LineSink | None = None

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        raise NotImplementedError

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        pass

    def usage(self) -> dict[str, Any]:
        return {}

    def stopped_for(self, operator: str) -> str | None:
        return None

    def unexplored(self, operator: str) -> list[str]:
        return []

    def exploration(self, operator: str) -> Exploration | None:
        return None

    def cancel(self, why: str) -> None:
        pass

    def close(self) -> None:
        pass


DECLARED = sorted(a for a in vars(AgentBase) if not a.startswith("_"))  # what `Agent` declares


def declared(made: Any, name: str) -> Agent:
    """What `pytest_kope_make_agent` returned, checked once against `Agent` (a ConfigError names
    what is missing: subclass AgentBase for the defaults)."""
    missing = [a for a in DECLARED if not hasattr(made, a)]
    if missing:
        raise ConfigError(
            f"--kope-agent {name}: {type(made).__name__} lacks {', '.join(sorted(missing))}; "
            "subclass pytest_kope.agents.base.AgentBase for the defaults"
        )
    agent: Agent = made
    return agent
