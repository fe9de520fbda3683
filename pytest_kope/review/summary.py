"""One operator's entry in report.json, typed: `OperatorSummary`, made by `report.operator_summary` and
filled in by the session (commit, loop, interrupt), written by `to_json()` and read back by `from_json()`.

`to_json()` is the one place the entry's keys, their order and their omissions are written: a field
that is None is left out, except in the full account of an operator whose baseline was judged
(schema's `optimized`), whose keys are all there, null ones too. The shape is
pytest_kope/schemas/report.schema.json's `operator`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from ..spec import Point

if TYPE_CHECKING:
    from ..judge.outcome import Judged


class Best(TypedDict):
    """The incumbent the account ends on (the verified winner when there is one)."""

    id: str
    idea: str
    params: Point


class CandidateEntry(TypedDict):
    """One judged candidate, as report.json and the speedup plot read it."""

    id: str
    agent: str
    idea: str
    params: Point
    parent: str | None
    outcome: str
    reason: str
    ratio: float | None
    ratio_low: float | None
    speedup: float | None
    time_s: float | None
    failures: list[str]
    notes: list[str]
    bar: str  # the tolerance its outputs were held to, and whence ("": not known, e.g. judged before)


class MachineBusy(TypedDict):
    """The share of the machine others used during the operator's timings."""

    median: float
    max: float
    timings: int


class AlreadyCommitted(TypedDict):
    """Where an earlier run committed the winner this run verified again."""

    branch: str | None
    commit: str | None


class PullRequest(TypedDict):
    """The pull request the publisher opened or updated."""

    number: int
    url: str
    created: bool


class Peers(TypedDict, total=False):
    """--kope-peers: the winner next to its best kernel-only peer (`Publisher.measure_peers`)."""

    headline: str
    error: str
    best_peer: str | None
    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    roof: str
    roof_fraction: float | None
    threads: int
    versions: dict[str, Any]


# "from" is a keyword: the functional form
TimedRtol = TypedDict("TimedRtol", {"rtol": float, "from": str})


@dataclass(frozen=True)
class Searched:
    """An operator's search as its summary tells it: what travels together from the loop's progress."""

    baseline: Judged
    incumbent: Judged  # the baseline when nothing beat it
    history: list[Judged]
    evaluations: int
    evaluations_to_best: int


@dataclass
class Winner:
    """Where the verified winner went: its branch and commit (None: not committed), the file a commit
    would hold when it went to no branch, and the earlier run's commit when it was found again."""

    branch: str | None = None
    commit: str | None = None
    file: str | None = None  # report.json's `winner_file`
    already_committed: AlreadyCommitted | None = None


PUBLISHED = ("peers", "branch_note", "push", "review_error", "pull_request")


@dataclass
class Published:
    """What `Publisher.after` adds for an operator (peers, push, pull request, plot). Keys it adds that
    this version does not name are kept in `other`, so none is lost on the way to report.json."""

    peers: Peers | None = None
    branch_note: str | None = None
    push: str | None = None
    review_error: str | None = None
    pull_request: PullRequest | None = None
    plot: str | None = None
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Published:
        """From the publisher's dict; keys it does not name go to `other`."""
        return cls(
            peers=d.get("peers"),
            branch_note=d.get("branch_note"),
            push=d.get("push"),
            review_error=d.get("review_error"),
            pull_request=d.get("pull_request"),
            plot=d.get("plot"),
            other={k: v for k, v in d.items() if k not in (*PUBLISHED, "plot")},
        )

    def to_json(self) -> dict[str, Any]:
        """In the order the publisher adds them: peers, then commit and push, the review, the plot."""
        out = _present({k: getattr(self, k) for k in PUBLISHED})
        return {**out, **self.other, **_present({"plot": self.plot})}


@dataclass(frozen=True)
class OperatorSummary:
    """One operator's entry in report.json, made once (`report.operator_summary`). `baseline_judged`
    says whether the full account (family to candidates) is written; every other field that is None
    is absent from the entry."""

    name: str
    verified: bool
    error: str | None = None  # stopped on an error (a broken baseline, a missing toolchain)
    baseline_judged: bool = False
    family: str | None = None
    toolchain: str | None = None
    source: str | None = None
    baseline_s: float | None = None
    best_s: float | None = None
    speedup: float | None = None
    evaluations: int | None = None
    evaluations_to_best: int | None = None
    winner: Winner = field(default_factory=Winner)
    best: Best | None = None
    note: str | None = None
    seconds: float | None = None
    outcomes: dict[str, int] | None = None
    candidates: list[CandidateEntry] | None = None
    timed_rtol: TimedRtol | None = None
    plain_pytest: dict[str, Any] | None = None  # `PlainRun.to_json()`
    baseline_isa: dict[str, Any] | None = None  # the same, with the instruction set held to the baseline
    flags_in_source: list[str] | None = None  # "flag: the pragma or clones that carry it" (own builds)
    machine_busy: MachineBusy | None = None
    published: Published = field(default_factory=Published)
    flaky_tests: list[str] | None = None
    fixed_input_tests: list[str] | None = None
    stopped: dict[str, Any] | None = None  # `stopping.stopped()`
    exploration: dict[str, list[str]] | None = None  # `Exploration.to_json()`
    search_failed: str | None = None
    infrastructure_faults: list[str] | None = None

    @property
    def failed(self) -> bool:
        """Stopped on an error, or the search itself failed: pytest's status counts it."""
        return self.error is not None or self.search_failed is not None

    def to_json(self) -> dict[str, Any]:
        """The entry report.json holds, in its keys' order."""
        w = self.winner
        out: dict[str, Any] = {"name": self.name, **_present({"error": self.error})}
        if self.baseline_judged:
            out.update(family=self.family, toolchain=self.toolchain, source=self.source)
            out.update(baseline_s=self.baseline_s, best_s=self.best_s, speedup=self.speedup)
            out.update(evaluations=self.evaluations, evaluations_to_best=self.evaluations_to_best)
        out["verified"] = self.verified
        if self.baseline_judged:
            out.update(branch=w.branch, commit=w.commit, best=self.best, note=self.note)
            out.update(seconds=self.seconds, outcomes=self.outcomes, candidates=self.candidates)
        out |= _present(
            {
                "timed_rtol": self.timed_rtol,
                "plain_pytest": self.plain_pytest,
                "baseline_isa": self.baseline_isa,
                "flags_in_source": self.flags_in_source,
                "winner_file": w.file,
                "machine_busy": self.machine_busy,
                "already_committed": w.already_committed,
            }
        )
        out |= self.published.to_json()
        return out | _present(
            {
                "flaky_tests": self.flaky_tests,
                "fixed_input_tests": self.fixed_input_tests,
                "stopped": self.stopped,
                "exploration": self.exploration,
                "search_failed": self.search_failed,
                "infrastructure_faults": self.infrastructure_faults,
            }
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OperatorSummary:
        """An entry read back (report.md from the run's data, `kope judge` from report.json); keys this
        version does not name are kept (in `published.other`) and written again."""
        get = d.get
        winner = Winner(get("branch"), get("commit"), get("winner_file"), get("already_committed"))
        return cls(
            name=d["name"],
            verified=bool(get("verified", False)),
            error=get("error"),
            baseline_judged="baseline_s" in d,  # what the report's readers have always tested
            family=get("family"),
            toolchain=get("toolchain"),
            source=get("source"),
            baseline_s=get("baseline_s"),
            best_s=get("best_s"),
            speedup=get("speedup"),
            evaluations=get("evaluations"),
            evaluations_to_best=get("evaluations_to_best"),
            winner=winner,
            best=get("best"),
            note=get("note"),
            seconds=get("seconds"),
            outcomes=get("outcomes"),
            candidates=get("candidates"),
            timed_rtol=get("timed_rtol"),
            plain_pytest=get("plain_pytest"),
            baseline_isa=get("baseline_isa"),
            flags_in_source=get("flags_in_source"),
            machine_busy=get("machine_busy"),
            published=Published.from_json({k: v for k, v in d.items() if k not in NAMED}),
            flaky_tests=get("flaky_tests"),
            fixed_input_tests=get("fixed_input_tests"),
            stopped=get("stopped"),
            exploration=get("exploration"),
            search_failed=get("search_failed"),
            infrastructure_faults=get("infrastructure_faults"),
        )


def _present(values: dict[str, Any]) -> dict[str, Any]:
    """The entries that are not None: a None field is an absent key."""
    return {k: v for k, v in values.items() if v is not None}


# report.json's keys that OperatorSummary and Winner hold themselves (the rest are the publisher's)
NAMED = frozenset(
    {
        *(
            f
            for f in OperatorSummary.__dataclass_fields__
            if f not in ("baseline_judged", "winner", "published")
        ),
        "branch",
        "commit",
        "winner_file",
        "already_committed",
    }
)
