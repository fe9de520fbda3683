"""Memory a test host shares with one kernel server: memfd segments mapped by both.

The host writes a call's inputs into a segment, the server runs the kernel on them there, and the
host reads the outputs back: no pickling, no copy through a pipe. A server sees only its own arena:
the other kernel of a paired timing has another, so nothing one kernel wrote is where the other can
read it. Segments are mapped MAP_SHARED from a memfd, so both kernels of a timing get pages
allocated the same way (4 KiB shared-memory pages; never numpy's private huge pages for one and not
the other).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field

ALIGN = 64
HEAP_CHUNK = 16 << 20  # a heap segment's least size: many small timing copies share one


@dataclass
class Segment:
    """One shared mapping: its id on both sides, the memfd, its size and its address here."""

    id: int
    fd: int
    size: int
    map: mmap.mmap
    base: int
    used: int = 0

    @classmethod
    def make(cls, id: int, size: int) -> Segment:
        size = max(ALIGN, size)
        fd = os.memfd_create(f"kope-arena-{id}", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(id, fd, size, mm, address_of(mm))

    def take(self, nbytes: int, phase: int = 0) -> int | None:
        """The offset of `nbytes` more bytes whose address is `phase` past a 64-byte boundary, or None
        when they do not fit."""
        start = (self.used + ALIGN - 1) // ALIGN * ALIGN + phase % ALIGN
        if start + nbytes > self.size:
            return None
        self.used = start + nbytes
        return start


def address_of(mm: mmap.mmap) -> int:
    """The address of a mapping's first byte (the mapping stays exported: it is never closed)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(mm))


@dataclass
class Arena:
    """The host's side of one server's shared memory: a heap for buffers that live through a timing,
    and a staging area per channel that each forwarded call reuses. `announce(segment)` hands a new
    segment's memfd to the server before any call uses it."""

    announce: Callable[[Segment, int | None], None]  # (segment, the channel the caller holds)
    segments: dict[int, Segment] = field(default_factory=dict)
    heap: list[Segment] = field(default_factory=list)
    staging: dict[int, Segment] = field(default_factory=dict)
    count: int = 0  # segments made: ids are never reused

    def _new(self, size: int, channel: int | None = None) -> Segment:
        self.count += 1
        segment = Segment.make(self.count, size)
        self.segments[segment.id] = segment
        self.announce(segment, channel)
        os.close(segment.fd)  # the server holds its own descriptor now; the mapping keeps the memory
        return segment

    def allocate(self, nbytes: int) -> tuple[Segment, int]:
        """Room for a buffer that lives until `release`: (segment, offset)."""
        for segment in self.heap[-1:]:
            at = segment.take(nbytes)
            if at is not None:
                return segment, at
        segment = self._new(max(HEAP_CHUNK, nbytes + ALIGN))
        self.heap.append(segment)
        at = segment.take(nbytes)
        assert at is not None
        return segment, at

    def stage(self, channel: int, sizes: list[tuple[int, int]]) -> tuple[Segment, list[int]]:
        """Offsets for one call's arrays in the channel's staging segment, each `(nbytes, phase)` at
        the same distance past a 64-byte boundary as the caller's own array (a kernel that faults on
        a misaligned pointer faults here as it would for the user)."""
        need = sum(n + 2 * ALIGN for n, _ in sizes)
        segment = self.staging.get(channel)
        if segment is None or segment.size < need:
            segment = self.staging[channel] = self._new(
                max(need, 2 * (segment.size if segment else 0)), channel
            )
        segment.used = 0
        offsets = [segment.take(n, phase) for n, phase in sizes]
        assert all(o is not None for o in offsets)
        return segment, [int(o) for o in offsets if o is not None]

    def locate(self, address: int, nbytes: int) -> tuple[int, int] | None:
        """(segment id, offset) of memory already in this arena's heap, or None."""
        for segment in self.heap:
            if segment.base <= address and address + nbytes <= segment.base + segment.size:
                return segment.id, address - segment.base
        return None

    def release(self) -> list[int]:
        """Forget the heap (its buffers die with their last view): the ids the server may unmap."""
        ids = [s.id for s in self.heap]
        for segment in self.heap:
            del self.segments[segment.id]
        self.heap = []
        return ids
