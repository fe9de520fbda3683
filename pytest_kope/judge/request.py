"""What the controller asks of one judging child: a `JudgeRequest`, serialized here and nowhere else.

The controller makes it (`controller/launch.py`), it travels as JSON (a fresh child's `spec.json`, a fork
server's request pipe, a Ray job), and the child reads it back with `from_json` (`child/plugin.py`,
`child/forkserver.py`). The run's `Settings` travel in it whole: a new setting that a child reads is
a field of `Settings`, not of this. The guards' switches
in the child follow from it (`guard_switches`), not from flags set elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..candidate import Candidate
from ..operator import Operator
from ..settings import Settings
from .controller.environments import USER


@dataclass(frozen=True)
class Shrink:
    """Shrink one drawn call the candidate fails (`child/draws.py`), against the oracle's kernel."""

    key: str
    oracle: Candidate


@dataclass(frozen=True)
class JudgeRequest:
    """One judgement or build step, as a child receives it. Paths are strings: an executor moves them."""

    candidate: Candidate
    operator: Operator
    results: str  # the file the child appends its signed events to
    tests: list[str] = field(default_factory=list)  # base node ids to run; none for a build step
    seeds: list[int] = field(default_factory=list)  # fresh-input seeds (correctness); none when timing
    reference: Candidate | None = None  # timing: the candidate is timed paired against it
    record: str | None = None  # record the committed kernel's calls into this folder
    replay: str | None = None  # replay the recorded calls from this folder and check the outputs
    rtol: float | None = None  # the tolerance timed outputs are checked with (None: the default)
    ceilings: dict[str, Any] | None = None  # measured bandwidth and FMA ceilings (timing only)
    environment: str = USER  # correctness: the environment it is judged in
    shrink: Shrink | None = None
    sanitize: bool = False  # build and serve the candidate with the sanitizers (`toolchains/sanitize.py`)
    key_fd: int | None = None  # a fresh child reads its signing key from this pipe
    settings: Settings = field(default_factory=Settings)  # the run's, whole: what a child reads of them

    @property
    def seed(self) -> int:
        """The session's seed in the child: the first fresh-input seed, else 1."""
        return self.seeds[0] if self.seeds else 1

    def guard_switches(self) -> dict[str, bool]:
        """How the guards run in this child: every judging child probes that results follow the data;
        one that replays recorded calls next leaves each call's settling to the replay; one that
        records the committed kernel's calls records them."""
        return {
            "probe": True,
            "settled_in_replay": self.replay is not None,
            "record": self.record is not None,
        }

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["candidate"], data["operator"] = self.candidate.to_json(), self.operator.to_json()
        data["reference"] = self.reference.to_json() if self.reference else None
        data["settings"] = self.settings.to_json()
        data["shrink"] = (
            {"key": self.shrink.key, "oracle": self.shrink.oracle.to_json()} if self.shrink else None
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JudgeRequest:
        given = dict(data)
        given["candidate"] = Candidate.from_json(data["candidate"])
        given["operator"] = Operator.from_json(data["operator"])
        given["reference"] = Candidate.from_json(data["reference"]) if data.get("reference") else None
        given["settings"] = Settings.from_json(data["settings"]) if "settings" in data else Settings()
        shrink = data.get("shrink")
        given["shrink"] = Shrink(shrink["key"], Candidate.from_json(shrink["oracle"])) if shrink else None
        return cls(**given)
