"""This machine's measured memory and FMA ceilings for a run (`judge/measure/physics.py` measures them):
once when the run starts, and once more before a `suspect` verdict stands."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..toolchains.base import Toolchain

if TYPE_CHECKING:
    from ..memory import Graph


@dataclass
class CeilingProbe:
    """The run's physics probe: where its builds go, and whether it ran (again) in this run."""

    graph: Graph
    builds: Path
    say: Callable[..., None]
    measured: bool = False  # the physics probe runs again once a run: ceilings only rise
    remeasured: bool = False  # and once more before a `suspect` verdict stands
    probing: threading.Lock = field(default_factory=threading.Lock)  # operators at once: one at a time


def measure_ceilings(probe: CeilingProbe, tc: Toolchain) -> dict[str, Any] | None:
    """This machine's measured memory and FMA ceilings, for kernels timed on the host CPU."""
    if not tc.timed_on_host:  # the seam for a device probe: any Ceilings record bounds the timings
        probe.say(
            f"kope: {tc.name} timings are not bound by physics: no probe measures this device's ceilings"
        )
        return None
    from ..judge.measure.physics import PhysicsProbeFailed, ceilings_for

    fresh = not probe.measured  # measured again once a run: ceilings only rise
    probe.measured = True
    try:
        found = ceilings_for(probe.graph, tc.fingerprint(), probe.builds, refresh=fresh)
        return found.to_json()
    except PhysicsProbeFailed as e:
        probe.say(f"kope: no physical bound on timings: {e}", red=True)
        return None


def remeasured_ceilings(probe: CeilingProbe, tc: Toolchain) -> dict[str, Any] | None:
    """The ceilings measured once more before a `suspect` verdict stands: a probe that ran while the
    machine was busy (or in its slow memory regime) measures them low, and an honest kernel then seems
    faster than physics. The probe runs again once a run; later calls get the stored, risen figures."""
    with probe.probing:
        if not probe.remeasured:
            probe.remeasured, probe.measured = True, False
        return measure_ceilings(probe, tc)
