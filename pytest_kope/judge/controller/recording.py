"""The committed kernel's recorded calls as the controller holds them (`differential.py` records
and replays them). Children replay from the folder; what decides a verdict is read once, before any
candidate runs, and held here, so a child that rewrites the folder (unjailed, it can) changes nothing
the controller compares with, and `Recording.changed` sees that it did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..child.differential import compare, take_expected


@dataclass(frozen=True)
class Recording:
    """The committed kernel's recorded calls as the controller holds them. Children replay from
    `folder`; what decides a verdict (the manifests, the expected outputs) is read once, before any
    candidate runs, and held here: a child that rewrites the folder (unjailed, it can) changes nothing
    the controller compares with, and `changed()` sees that it did (`stamp`)."""

    folder: Path
    manifest: list[dict[str, Any]]
    expected: dict[str, dict[str, np.ndarray]]
    drawn_manifest: list[dict[str, Any]]
    drawn_expected: dict[str, dict[str, np.ndarray]]
    stamp: tuple[tuple[str, int, int, int], ...]

    @classmethod
    def take(cls, folder: Path) -> Recording:
        """Read the folder's manifests and take its expected outputs off the disk."""
        expected, drawn = take_expected(folder), take_expected(folder / "draws")
        return cls(folder, _manifest(folder), expected, _manifest(folder / "draws"), drawn, stamp(folder))

    def changed(self) -> bool:
        """Whether anything in the folder was written, added, removed or replaced since it was taken."""
        return stamp(self.folder) != self.stamp

    def relaxed(self, rtol: float) -> tuple[int, float]:
        """On how many calls the committed kernel's own error (`noise.py`) widens the bar `rtol` by a
        tenth of it or more, and the most it widens it on any call."""
        errors = [float(e.get("own_error", 0.0)) for e in (*self.manifest, *self.drawn_manifest)]
        return sum(e >= rtol / 10 for e in errors), max(errors, default=0.0)

    def compare(self, outputs: Path, rtol: float, drawn: bool = True) -> list[str]:
        """Where a candidate's replayed outputs differ from the committed kernel's, on the tests' calls
        and then (`drawn`: the child replayed them) on the drawn ones."""
        return compare(self.manifest, self.expected, outputs, rtol) or (
            compare(self.drawn_manifest, self.drawn_expected, outputs / "draws", rtol)
            if self.drawn_expected and drawn
            else []
        )


@dataclass(frozen=True)
class Differential:
    """The differential check of one child: its replayed outputs against `recording` at `rtol` (and
    on the drawn calls when the child replayed them). Decided in the controller, from the outputs."""

    recording: Recording
    rtol: float
    drawn: bool = True

    def check(self, events: list[dict[str, Any]], outputs: Path) -> list[str]:
        """The findings: the recording spoiled meanwhile, the replay's own problems, or differences."""
        if self.recording.changed():
            return [
                f"the committed kernel's recorded calls in {self.recording.folder} changed while this child"
                " ran (they are the judge's: a candidate writes only its own outputs; unjailed, a candidate"
                " judged at the same time may have done it)"
            ]
        done = [e for e in events if e["event"] == "replayed"]
        problems = (
            done[-1]["problems"] if done else ["the candidate's child never replayed the recorded calls"]
        )
        if problems:
            return [str(p) for p in problems]
        return self.recording.compare(outputs, self.rtol, self.drawn)


def said_bar(rtol: float, source: str, recording: Recording | None) -> str:
    """The bar a candidate was judged at and whence, in one line, with how far the committed
    kernel's own error relaxed it on the recorded and drawn calls."""
    relaxed, most = recording.relaxed(rtol) if recording is not None else (0, 0.0)
    said = f"rtol {rtol:.3g}, {source}"
    if relaxed:
        said += (
            f"; on {relaxed} call(s) relaxed by the committed kernel's own error there (at most {most:.3g})"
        )
    return said


def stamp(folder: Path) -> tuple[tuple[str, int, int, int], ...]:
    """Each file's path, inode, size and change time: a write, rename or chmod sets the change time
    to the clock's now, which no unprivileged process can set back (utime sets only the others)."""
    found = []
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        found.append((p.relative_to(folder).as_posix(), st.st_ino, st.st_size, st.st_ctime_ns))
    return tuple(found)


def _manifest(folder: Path) -> list[dict[str, Any]]:
    path = folder / "manifest.json"
    return list(json.loads(path.read_text())) if path.exists() else []
