"""This machine's measured memory and FMA ceilings for a run (`judge/measure/physics.py` measures them): once
when the run starts, and once more before a `suspect` verdict stands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..toolchains.base import Toolchain

if TYPE_CHECKING:
    from .session import KopeSession


def measure_ceilings(s: KopeSession, tc: Toolchain) -> dict[str, Any] | None:
    """This machine's measured memory and FMA ceilings, for kernels timed on the host CPU."""
    if not tc.timed_on_host:  # the seam for a device probe: any Ceilings record bounds the timings
        s.say(f"kope: {tc.name} timings are not bound by physics: no probe measures this device's ceilings")
        return None
    from ..judge.measure.physics import PhysicsProbeFailed, ceilings_for

    fresh = not s.ceilings_measured  # measured again once a run: ceilings only rise
    s.ceilings_measured = True
    try:
        found = ceilings_for(s.graph, tc.fingerprint(), s.kope_base / "builds", refresh=fresh)
        return found.to_json()
    except PhysicsProbeFailed as e:
        s.say(f"kope: no physical bound on timings: {e}", red=True)
        return None


def remeasured_ceilings(s: KopeSession, tc: Toolchain) -> dict[str, Any] | None:
    """The ceilings measured once more before a `suspect` verdict stands: a probe that ran while the
    machine was busy (or in its slow memory regime) measures them low, and an honest kernel then seems
    faster than physics. The probe runs again once a run; later calls get the stored, risen figures."""
    with s.probing:
        if not s.ceilings_remeasured:
            s.ceilings_remeasured, s.ceilings_measured = True, False
        return measure_ceilings(s, tc)
