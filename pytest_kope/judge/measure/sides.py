"""One kernel's side of a timing: its call, its own copies of the arguments, and how a timed block of
it runs (in this process, or in its kernel server in one request), with the clock that reads it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from .rotation import Rotation

if TYPE_CHECKING:
    from ..kernel.remote import Blocks, Forwarded

Call = Callable[..., object]
REMOTE_MIN_ROUND_S = 0.01  # a served kernel's block: its request's two wake-ups (~0.1 ms here) under 2%


@dataclass(frozen=True)
class Budget:
    """How long a timing may take: rounds, calls per round, wall time."""

    warmup: int = 1  # calls before measuring (first-touch page faults, lazy binding, caches)
    min_round_s: float = 0.005  # calibrate calls per round so a round lasts at least this
    min_rounds: int = 5
    max_rounds: int = 50
    max_time_s: float = 1.0  # stop adding rounds after this much measuring
    look_every: int = 2  # paired: after min_rounds, ask every this many rounds whether the answer is known
    first_look: int = 0  # paired: the round of the first look, when earlier than min_rounds (`decided`)

    def looks_after(self, rounds: int) -> bool:
        """Whether paired rounds ask, after `rounds` of them, if the answer is known."""
        after_min = rounds >= self.min_rounds and (rounds - self.min_rounds) % self.look_every == 0
        return rounds == self.first_look or after_min


@dataclass(frozen=True)
class CallArgs:
    """The arguments of the timed call, and their roles (IN, OUT, INOUT, SCALAR; None: arrays read only)."""

    values: Sequence[object]
    roles: Sequence[str] | None = None


@dataclass(frozen=True)
class Clock:
    """How a timing reads time: `now` in seconds, `sync` waits for queued device work (no-op on a CPU)."""

    now: Callable[[], float]
    sync: Callable[[], object]


@dataclass
class Side:
    """One kernel of a timing: its call, its own copies of the arguments, and where its blocks run
    (here, or in its kernel server, in one request a block: `remote`, a `Forwarded`)."""

    call: Call
    rotation: Rotation
    remote: Forwarded | None = None
    _blocks: Blocks | None = field(default=None, repr=False)
    _named: tuple[int, ...] = ()

    @classmethod
    def of(cls, fn: Call, args: CallArgs) -> Side:
        """A side for `fn` with a rotation of its own (in its server's arena when it is served)."""
        remote = cast("Forwarded", fn) if hasattr(fn, "blocks") else None  # served: a kernel server's
        allocate = remote.allocate if remote is not None else None
        return cls(fn, Rotation(args.values, args.roles, allocate=allocate), remote)

    def min_round(self, budget: Budget) -> float:
        return max(budget.min_round_s, REMOTE_MIN_ROUND_S) if self.remote is not None else budget.min_round_s

    def run(self, start: int, n: int, clock: Clock) -> float:
        """Seconds for `n` calls from call number `start`, cycling the rotation's copies."""
        if self.remote is None:
            return _run(self.call, self.rotation.sets, start, n, clock.now, clock.sync)
        named = tuple(id(s) for s in self.rotation.sets)
        if self._blocks is None or named != self._named:  # the copies changed (`fit`): named anew
            self._blocks, self._named = self.remote.blocks(self.rotation.sets), named
        took: float = self._blocks.run(start, n, clock.now)
        return took

    def repeat(self, k: int, times: int, clock: Clock) -> None:
        """Call the kernel `times` on copy `k` alone (the check after the rounds)."""
        for _ in range(times):
            self.run(k, 1, clock)


def _run(
    fn: Call,
    sets: list[tuple[object, ...]],
    start: int,
    n: int,
    clock: Callable[[], float],
    sync: Callable[[], object],
) -> float:
    sync()
    t0 = clock()
    for i in range(n):
        fn(*sets[(start + i) % len(sets)])
    sync()
    return clock() - t0
