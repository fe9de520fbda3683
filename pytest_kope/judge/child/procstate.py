"""Process-wide state one kernel could leave for the other in a paired timing.

Candidate and reference are timed in one process, in alternating blocks. Whatever the candidate
leaves set between its blocks (thread counts, flush-to-zero in its pool's threads, torch's default
dtype or grad mode, numpy's error handling) runs the reference's next block under it: a candidate
could slow the reference, or speed itself, and set everything back before the end. So the state is
taken before the first block and checked after every block, outside the timed windows, in every
thread (`fpstate`: ~45 us for two threads here). A block that changed it ends the timing with a
`GuardViolation` naming what changed; the FP state is set back.

Settings are read only from libraries the process has loaded: this module imports none.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any

from . import fpstate


def _settings() -> dict[str, Any]:
    """The process-wide settings of the loaded libraries, by name."""
    found: dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        found["torch threads"] = torch.get_num_threads()
        found["torch inter-op threads"] = torch.get_num_interop_threads()
        found["torch default dtype"] = str(torch.get_default_dtype())
        found["torch grad mode"] = torch.is_grad_enabled()
        found["torch deterministic algorithms"] = torch.are_deterministic_algorithms_enabled()
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "geterr"):
        found["numpy error handling"] = numpy.geterr()
    threads = _openmp_max_threads()
    if threads is not None:
        found["OpenMP threads"] = threads
    return found


def _openmp_max_threads() -> int | None:
    """libgomp's thread count for the next parallel region, when libgomp is loaded (never loads it)."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    return int(gomp.omp_get_max_threads())


@dataclass(frozen=True)
class Snapshot:
    """The state as it was before the first timed block."""

    settings: dict[str, Any]
    fp: fpstate.State | None

    @classmethod
    def take(cls) -> Snapshot:
        return cls(_settings(), fpstate.current())

    def changes(self) -> list[str]:
        """What differs now, each named ("changed torch threads 2 -> 1"); the FP control state is set back."""
        now = _settings()
        found = [
            f"changed {name} {was!r} -> {now.get(name)!r}"
            for name, was in self.settings.items()
            if now.get(name) != was
        ]
        return found + fpstate.changes(self.fp)
