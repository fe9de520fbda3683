"""One judgement as the runner asks it of the launcher (`Request`), and as the verdict reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...candidate import Candidate
from . import environments
from .recording import Differential


@dataclass(frozen=True)
class Request:
    """One judgement: the candidate and the tests it runs; timed against `reference` when given; the
    committed kernel's calls recorded into `record`, or recorded calls replayed from `replay_from`
    and their outputs checked by `differential`."""

    candidate: Candidate
    tests: list[str]
    seeds: list[int] = field(default_factory=list)
    reference: Candidate | None = None
    device: int | None = None
    record: Path | None = None
    replay_from: Path | None = None
    differential: Differential | None = None
    environment: str = environments.USER  # correctness: where it is judged (`environments.py`)
    shrink: str | None = None  # a drawn call to shrink (`draws.py`) instead of replaying, against `oracle`
    oracle: Candidate | None = None
    sanitize: bool = False  # built and served with the sanitizers (`toolchains/sanitize.py`)
