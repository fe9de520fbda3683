"""The copies of a timed call's arguments, and the fresh inputs and poisoned outputs of every block.

No timed call sees inputs a kernel could relate to any it saw before: every preparation of a copy
draws its own seed from the operating system, and each element of every floating input is the
test's element times its own random factor (`freshinputs`: dtype, shape, range, signs, zeros and
integer values kept; no copy a scaled, offset or permuted version of another). Both kernels of a
round see the same inputs, new ones every round. Large buffers are prepared by `memops` (threaded).

Each kernel of a paired timing has a rotation of its own (in its kernel server's arena, `allocate`),
so nothing one kernel wrote is ever where the other is given an address.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import arrays
from .freshinputs import Domain, fresh

IN, OUT, INOUT, SCALAR = "in", "out", "inout", "scalar"  # the roles of toolchains.base.Arg
MAX_COPY_BYTES = 256 << 20  # copies made for a block of many calls (`Rotation.fit`), in all


def last_level_cache_bytes() -> int:
    """The size of this machine's last-level cache, in bytes."""
    from .caches import last_level_cache_bytes as found  # sysfs, lscpu, sysconf, then a generous guess

    return found()


class Rotation:
    """Copies of one call's arguments, enough to overflow the last-level cache, cycled call to call.

    Repeated calls on one buffer would time cache hits, not the kernel. Every copy is allocated the
    same way (`allocate`: in a kernel server's arena, where the kernel runs; else here), and both
    kernels' rotations alike, so neither gets luckier pages. At least two copies always, so
    consecutive calls never see the same buffer.
    """

    def __init__(
        self,
        args: Sequence[object],
        roles: Sequence[str] | None = None,
        max_copies: int = 8,
        allocate: Callable[[Any], Any] | None = None,
    ):
        self.allocate = allocate
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
        if allocate is not None:  # a kernel server sees only its arena: no caller's array is shared
            shared = {i for i in shared if self.roles[i] == SCALAR}
        self.sets = [
            tuple(
                a if i in shared and k == 0 else self._blank(a) if i in blank else self._clone(a)
                for i, a in enumerate(args)
            )
            for k in range(copies)
        ]
        self.pristine = {i: args[i] for i in self.varied}  # on the arguments' own device
        self.caller = list(args)
        self.domains = {i: Domain.of(args[i]) for i in self.varied}
        self.prepared: set[int] = set()  # copies given fresh inputs and poisoned outputs at least once
        self.touched: set[int] = set()  # copies whose pages `touch_alike` faulted in
        self.bytes_per_call = size

    def seeds(self) -> list[int | None]:
        """A new seed for every copy, from the operating system: no copy ever holds inputs seen
        before, nor inputs a kernel could predict from them."""
        return [secrets.randbits(64) for _ in self.sets]

    def exact(self) -> list[int | None]:
        """Seeds that prepare the test's own inputs, exactly (a guarded first call)."""
        return [None for _ in self.sets]

    def prepare(
        self, seeds: Sequence[int | None], used: Sequence[int] | None = None, poison: bool = True
    ) -> None:
        """Give the copies in `used` (all by default) the fresh inputs of their seed and poisoned
        outputs (`poison` False: the caller poisons them, as a guarded call's own guard does)."""
        for k in range(len(self.sets)) if used is None else used:
            self.prepared.add(k)
            self.fresh_inputs(self.sets[k], seeds[k])
            if poison:
                self.poison_outputs(k)

    def fresh_inputs(self, values: Sequence[Any], seed: int | None, skip: Sequence[int] = ()) -> None:
        """Write the fresh inputs of `seed` into `values` (a copy's arguments, or scratch in their
        places), but for the arguments in `skip`."""
        for i in self.varied:
            if i not in skip:
                fresh(values[i], self.pristine[i], seed, self.domains[i])

    def poison_outputs(self, k: int) -> None:
        """Poison copy `k`'s OUT buffers."""
        for i in self.outputs:
            if self.roles[i] == OUT:
                arrays.poison(self.sets[k][i])

    def keep(self, copies: int) -> None:
        """Cycle through the first `copies` copies only; the others were never written, so never
        faulted in. Every timed block re-prepares the copies it uses right before its calls, so a
        block of n calls needs n copies (two at least: consecutive calls never share a buffer), and
        more do nothing but fault in memory: under a 480 MiB last-level cache, eight copies of a
        128 MiB call were 1 GiB of first touches (1.3 s of a 1.6 s timing); a 3 ms rowsum timed two
        calls a block on eight 64 MiB copies spent about a second of its timing there."""
        del self.sets[max(1, copies) :]
        self.prepared &= set(range(len(self.sets)))
        self.touched &= set(range(len(self.sets)))

    def fit(self, calls: int) -> None:
        """Exactly one copy for each of a block's `calls` (two at least), so no call of a block sees
        inputs an earlier call of it saw: `keep` drops copies beyond them, and a block of more calls
        than copies (a fast kernel, many calls a block) gets new ones, up to MAX_COPY_BYTES in all
        (past it, copies come round again within a block, still fresh every round)."""
        want = max(2, calls)
        if self.bytes_per_call:
            want = min(want, max(len(self.sets), MAX_COPY_BYTES // self.bytes_per_call))
        first = self.sets[0]
        while len(self.sets) < want:
            self.sets.append(
                tuple(
                    self._blank(a) if i in self.varied or self.roles[i] == OUT else self._clone(a)
                    for i, a in enumerate(first)
                )
            )
        self.keep(want)

    def capacity(self) -> int:
        """The most copies `fit` would make: a block of more calls would write some copy twice."""
        if not self.bytes_per_call:
            return 1 << 20
        return max(2, len(self.sets), MAX_COPY_BYTES // self.bytes_per_call)

    def used(self, start: int, n: int) -> list[int]:
        """The copies a block of `n` calls from call number `start` goes through."""
        return sorted({(start + i) % len(self.sets) for i in range(min(n, len(self.sets)))})

    def outputs_of(self, k: int) -> dict[int, np.ndarray | None]:
        """Copy `k`'s outputs on the host: views where they are on the host, else host copies."""
        return {i: arrays.host(self.sets[k][i]) for i in self.outputs}

    def _blank(self, a: Any) -> Any:
        if self.allocate is not None and arrays.is_array(a):
            return self.allocate(a)
        return _blank(a)

    def _clone(self, a: Any) -> Any:
        if self.allocate is not None and arrays.is_array(a):
            made = self.allocate(a)
            copy_into(made, a)
            return made
        return _clone(a)


PAGE = 4096
TOUCH_CHUNK = 256 << 10


def touch_alike(a: Rotation, b: Rotation) -> None:
    """Fault in the pages of both rotations' new copies in turn, a chunk of one and then the same
    chunk of the other (which goes first alternating), their contents unchanged.

    Pages are handed out in the order they are first written, and where a page lies changes how fast
    a memory-bound kernel streams it. Faulted in by each kernel's own preparations, one kernel's
    copies were always written first: on A/A pairs of one machine code (a 64 MiB rowsum, a 2-core
    VM), the kernel whose copies were written later was 5-15% faster in every round, whichever it
    was and on whichever CPU (all on one CPU too), and the same machine code was verified as
    1.06-1.19x faster than itself."""
    for k in range(max(len(a.sets), len(b.sets))):
        for x, y in zip(_untouched_bytes(a, k), _untouched_bytes(b, k)):
            for n, at in enumerate(range(0, max(x.nbytes, y.nbytes), TOUCH_CHUNK)):
                for z in (x, y) if n % 2 == 0 else (y, x):
                    pages = z[at : at + TOUCH_CHUNK : PAGE]
                    pages[...] = pages.copy()  # a write to each page: faulted in now, unchanged
        for r in (a, b):
            if k < len(r.sets):
                r.touched.add(k)


def _untouched_bytes(r: Rotation, k: int) -> list[np.ndarray]:
    """Copy `k`'s host arrays as bytes (none when it is touched already); an empty array where an
    argument is no array of its own (a scalar, or shared with the caller)."""
    if k >= len(r.sets) or k in r.touched:
        return []
    out = []
    for i, v in enumerate(r.sets[k]):
        mine = r.roles[i] != SCALAR and not (k == 0 and v is r.caller[i])
        if mine and isinstance(v, np.ndarray) and v.flags.c_contiguous and v.flags.writeable:
            out.append(v.reshape(-1).view(np.uint8))
        else:
            out.append(np.empty(0, np.uint8))
    return out


def copy_into(target: Any, source: Any) -> None:
    """`target[...] = source` for a numpy array or a torch tensor (on its own device)."""
    if isinstance(target, np.ndarray):
        np.copyto(target, source)
    else:  # a torch tensor, on its own device
        target.copy_(source)


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
