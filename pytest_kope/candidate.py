"""A candidate kernel: whole source plus build parameters, named by a content hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .spec import Point, as_point


@dataclass(frozen=True)
class Candidate:
    """What an agent proposes. `params` are the tuning-space point (defines and the `flags` axis)."""

    source: str
    filename: str  # the operator's source file name; gives the language (softmax.c, softmax.py)
    toolchain: str
    params: Point = field(default_factory=dict)
    idea: str = ""
    agent: str = ""
    parent: str | None = None  # hash of the candidate this one was derived from

    @property
    def hash(self) -> str:
        blob = json.dumps(
            [self.toolchain, self.filename, self.source, sorted(self.params.items())], default=str
        ).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def short(self) -> str:
        return self.hash[:8]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "hash": self.hash}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Candidate:
        """A candidate read back from `to_json`'s dict; its params are checked into a Point here."""
        fields = {k: v for k, v in data.items() if k != "hash"}
        if "params" in fields:
            fields["params"] = as_point(fields["params"])
        return cls(**fields)

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> Candidate:
        return cls.from_json(json.loads(Path(path).read_text()))
