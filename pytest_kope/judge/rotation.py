"""The copies of a timed call's arguments, and the fresh inputs and poisoned outputs of every block.

No two timed rounds see the same inputs: every rotation copy holds the test's floating inputs times
its own factor near 1 (structure kept, no two copies equal), and each round draws new factors, so a
kernel that remembers "the same input as last time" never sees one. Large buffers are prepared by
`memops` (threaded, bit for bit numpy's result).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import arrays, memops

IN, OUT, INOUT, SCALAR = "in", "out", "inout", "scalar"  # the roles of toolchains.base.Arg


def last_level_cache_bytes() -> int:
    """The size of this machine's last-level cache, in bytes."""
    from .caches import last_level_cache_bytes as found  # sysfs, lscpu, sysconf, then a generous guess

    return found()


class Rotation:
    """Copies of one call's arguments, enough to overflow the last-level cache, cycled call to call.

    Repeated calls on one buffer would time cache hits, not the kernel. Every copy is allocated the
    same way, and candidate and reference share them, so neither gets luckier pages. At least two
    copies always, so consecutive calls never see the same buffer.
    """

    def __init__(self, args: Sequence[object], roles: Sequence[str] | None = None, max_copies: int = 8):
        self.roles = (
            list(roles) if roles is not None else [IN if arrays.is_array(a) else SCALAR for a in args]
        )
        size = sum(int(getattr(a, "nbytes", 0)) for a in args)
        copies = 1 if size == 0 else min(max_copies, max(2, math.ceil(2 * last_level_cache_bytes() / size)))
        self.varied = [
            i for i, (a, r) in enumerate(zip(args, self.roles)) if r in (IN, INOUT) and _floating(a)
        ]
        self.outputs = [i for i, r in enumerate(self.roles) if r in (OUT, INOUT)]
        # `prepare` writes every varied input and every OUT buffer before a call sees them: those
        # copies start blank (a 64 MiB copy read for nothing), the others start as copies. The
        # caller's arrays are never written: they are the pristine inputs, and the first copy shares
        # only what no call writes. In a forked timing child they stay the server's pages; writing
        # them, or cloning them, faulted in fresh memory (0.1-0.2 s for 64 MiB on a VM whose huge
        # pages are compacted on demand).
        blank = {*self.varied, *(i for i in self.outputs if self.roles[i] == OUT)}
        shared = {i for i, r in enumerate(self.roles) if r in (IN, SCALAR) and i not in blank}
        self.sets = [
            tuple(
                a if i in shared and k == 0 else _blank(a) if i in blank else _clone(a)
                for i, a in enumerate(args)
            )
            for k in range(copies)
        ]
        self.pristine = {i: args[i] for i in self.varied}  # on the arguments' own device
        self.prepared: set[int] = set()  # copies given fresh inputs and poisoned outputs at least once
        self.bytes_per_call = size
        self._random = random.Random(0x6B6F7065)

    def factors(self) -> list[float]:
        """A new factor near 1 for every copy: no copy ever holds contents seen before."""
        return [self._random.uniform(0.97, 1.03) for _ in self.sets]

    def prepare(
        self, factors: Sequence[float], used: Sequence[int] | None = None, poison: bool = True
    ) -> None:
        """Give the copies in `used` (all by default) fresh inputs and poisoned outputs (`poison`
        False: the caller poisons them, as a guarded call's own guard does)."""
        for k in range(len(self.sets)) if used is None else used:
            self.prepared.add(k)
            values = self.sets[k]
            for i in self.varied:
                _rescale(values[i], self.pristine[i], factors[k])
            for i in self.outputs:
                if self.roles[i] == OUT and poison:
                    arrays.poison(values[i])

    def keep(self, copies: int) -> None:
        """Cycle through the first `copies` copies only; the others were never written, so never
        faulted in. Every timed block re-prepares the copies it uses right before its calls, so a
        block of n calls needs n copies (two at least: consecutive calls never share a buffer), and
        more do nothing but fault in memory: under a 480 MiB last-level cache, eight copies of a
        128 MiB call were 1 GiB of first touches (1.3 s of a 1.6 s timing); a 3 ms rowsum timed two
        calls a block on eight 64 MiB copies spent about a second of its timing there."""
        del self.sets[max(1, copies) :]
        self.prepared &= set(range(len(self.sets)))

    def used(self, start: int, n: int) -> list[int]:
        """The copies a block of `n` calls from call number `start` goes through."""
        return sorted({(start + i) % len(self.sets) for i in range(min(n, len(self.sets)))})

    def park(self, k: int) -> dict[int, np.ndarray | None]:
        """Copy `k`'s outputs aside: into the next copy's OUT buffers, already in memory and poisoned
        again before that copy is next used, rather than into fresh memory (an in-place argument,
        or one off the host, gets a host copy). Not swapped with them, which costs no copy: then the
        first block of every round wrote one buffer and the second the other, and an A/A sgemm pair
        came out 1.03-1.06 every time (six of six; 0.99-1.01 copied)."""
        spare = self.sets[(k + 1) % len(self.sets)]
        out: dict[int, np.ndarray | None] = {}
        for i in self.outputs:
            target, written = spare[i], self.sets[k][i]
            if (
                self.roles[i] == OUT
                and isinstance(target, np.ndarray)
                and isinstance(written, np.ndarray)
                and target is not written
            ):
                if not memops.copy_into(target, written):
                    np.copyto(target, written)
                out[i] = target
            else:
                out[i] = arrays.host_copy(self.sets[k][i])
        return out

    def outputs_of(self, k: int) -> dict[int, np.ndarray | None]:
        """Copy `k`'s outputs on the host: views where they are on the host, else host copies."""
        return {i: arrays.host(self.sets[k][i]) for i in self.outputs}


def _rescale(target: Any, pristine: Any, factor: float) -> None:
    """target = pristine * factor in one pass on the data's own device (no host round trip)."""
    if memops.scale_into(target, pristine, factor):  # a large buffer: threaded (`memops`)
        return
    if isinstance(target, np.ndarray):
        with np.errstate(all="ignore"):  # an input's NaN (even a signaling one) is the test's to give
            np.multiply(pristine, pristine.dtype.type(factor), out=target)
    else:  # a torch tensor: seen on an H200, a host round trip per block made one timing take a minute
        import torch

        torch.mul(pristine, factor, out=target)


def _floating(a: object) -> bool:
    h = arrays.host(a)
    return h is not None and h.dtype.kind == "f"


def _blank(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return np.empty_like(a)
    if hasattr(a, "clone"):
        import torch

        return torch.empty_like(a)
    return a


def _clone(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        return a.copy()
    if hasattr(a, "clone"):
        return a.clone()
    return a
