"""How busy the machine was while a timing ran: the share of all CPUs' time other processes used.

A paired ratio moves with load: when another process holds a core, a kernel of two threads loses half
its speed and one of one thread nothing (measured on a 2-core VM: one winner verified at 3.59x, then
at 7.18x minutes later), and the ratio's interval does not show it. So a timing child reads the
kernel's counters of every CPU (`/proc/stat`, global even in the jail's PID namespace) around its
timed window, takes away its own CPU time (all its threads, `getrusage`), and reports the rest, steal
time included, over the window's CPU time: 0 on an idle machine, 0.5 with one other busy core of two.
Where /proc/stat cannot be read, the figure is unknown (None).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

CONTENDED = 0.2  # a timing taken with others using this share of the machine is taken again
PROC_STAT = "/proc/stat"


@dataclass(frozen=True)
class Load:
    """The machine's CPU counters and this process's CPU time at one moment."""

    busy_s: float  # all CPUs' non-idle time (steal included) since boot
    total_s: float  # all CPUs' time since boot
    own_s: float  # this process's CPU time, every thread

    @classmethod
    def now(cls, pids: tuple[int, ...] = ()) -> Load | None:
        try:
            with open(PROC_STAT) as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu":
            return None
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
        hz = float(os.sysconf("SC_CLK_TCK"))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        idle = ticks[3] + ticks[4]
        served = sum(_cpu_ticks(pid) for pid in pids) / hz  # kernel servers: this timing's own work
        return cls((sum(ticks) - idle) / hz, sum(ticks) / hz, usage.ru_utime + usage.ru_stime + served)

    def others_since(self, before: Load) -> float:
        """The share of the machine's CPU time between `before` and now that others used (0..1)."""
        total = self.total_s - before.total_s
        if total <= 0:
            return 0.0
        others = (self.busy_s - before.busy_s) - (self.own_s - before.own_s)
        return min(1.0, max(0.0, others / total))


def _cpu_ticks(pid: int) -> int:
    """User and system ticks of process `pid`, every thread (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


class Window:
    """Around a timed window: `with Window() as w: ...`, then `w.others` (None: unknown). `pids`: the
    kernel servers timed in it, whose CPU time is the timing's own, not others'."""

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self.others: float | None = None
        self._before: Load | None = None
        self.pids = pids

    def __enter__(self) -> Window:
        self._before = Load.now(self.pids)
        return self

    def __exit__(self, *exc: object) -> None:
        after = Load.now(self.pids)
        if self._before is not None and after is not None:
            self.others = after.others_since(self._before)
