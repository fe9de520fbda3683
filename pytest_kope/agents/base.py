"""What an agent is: it proposes candidates for one operator and hears how they were judged.

Agents are made by the `pytest_kope_make_agent` hook: `tuner`, `claude[:MODEL]`, `openai:MODEL` and `replay:DIR` are built in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..candidate import Candidate
from ..judge.outcome import Judged
from ..spec import TuningSpace
from .exploration import Exploration


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
    recall: Callable[..., Any]  # recall(state=..., budget=...) -> memory.recall.Recall
    seen: Callable[[str], bool]  # is a candidate hash already in the graph for this task?


@runtime_checkable
class Agent(Protocol):
    """What proposes candidates: see `propose` and `observe`; made by `pytest_kope_make_agent`."""

    name: str

    def propose(self, ctx: Context, n: int) -> list[Candidate]:
        """Up to `n` new candidates. An empty list means the agent has nothing more to try; an agent
        that knows its search has converged may say why in an attribute `done` (a str, else None),
        which the report gives as the reason the operator's search stopped. An agent whose list is
        fixed and meant to be judged whole (replay) sets a class attribute `exhaustive = True`: then
        --kope-patience does not stop it early."""

    def observe(self, ctx: Context, results: list[Judged]) -> None:
        """The verdicts on the last proposals (in the order proposed)."""

    def usage(self) -> dict[str, Any]:
        """Cost so far for the report: e.g. calls, input/output/cache tokens, faults seen."""


@runtime_checkable
class Explores(Protocol):
    """An agent that knows which axes of an operator's space it has not explored around the
    incumbent (the tuner): no gain in N evaluations does not stop it while there are any, and the
    report names them."""

    def unexplored(self, operator: str) -> list[str]: ...

    def exploration(self, operator: str) -> Exploration | None: ...
