"""A sanitized kernel's arguments in memory AddressSanitizer watches: each array copied into a buffer
of its own from the (preloaded) sanitizer's `malloc`, with redzones on both sides, for the call.

A served call's arrays lie in the host's shared arena, packed one after the other: a read past the
end of one array reads the next, and memory ASan did not allocate has no redzones, so an
out-of-bounds read there is never reported. For the sanitized run of a candidate (`toolchains/
sanitize.py`) each array is copied into its own allocation before the call and back after it. The
copy keeps the array's distance past a 64-byte boundary (a kernel that needs its caller's alignment
gets it); the bytes in front of it up to that boundary are poisoned, so a read before the array's
first element is reported as well as one past its last.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

ALIGN = 64


def nbytes(arg: dict[str, Any]) -> int:
    """The bytes of one array argument as a host describes it (`remote._array`: a numpy dtype string
    such as "<f4" ends with its item size)."""
    return int(math.prod(arg["shape"])) * int(str(arg["dtype"])[2:])


@contextmanager
def copied(
    args: list[dict[str, Any]], address: Callable[[dict[str, Any]], int], pointer: Callable[[int], Any]
) -> Iterator[list[Any]]:
    """The call's arguments with every array in an allocation of its own (scalars as given), copied
    back to where `address` says it lives when the call is over, even when it failed."""
    libc = ctypes.CDLL(None)  # the preloaded sanitizer's malloc and free come first
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    poison = getattr(libc, "__asan_poison_memory_region", None)
    held: list[tuple[int, int, int]] = []  # (allocation, copy, arena address) per array
    values: list[Any] = []
    try:
        for arg in args:
            if "s" in arg:
                values.append(arg["s"])
                continue
            where, size = address(arg), nbytes(arg)
            phase = where % ALIGN
            block = ctypes.c_void_p()
            if libc.posix_memalign(ctypes.byref(block), ALIGN, max(1, phase + size)) != 0 or not block.value:
                raise MemoryError(f"no memory for a {size}-byte argument")
            copy = block.value + phase
            held.append((block.value, copy, where))
            ctypes.memmove(copy, where, size)
            if poison is not None and phase >= 8:  # in 8-byte granules, as the shadow memory keeps them
                poison.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                poison(block.value, phase // 8 * 8)
            values.append(pointer(copy))
        yield values
    finally:
        unpoison = getattr(libc, "__asan_unpoison_memory_region", None)
        sizes = [nbytes(a) for a in args if "s" not in a]
        for (block_at, copy, where), size in zip(held, sizes):
            ctypes.memmove(where, copy, size)
            if unpoison is not None:
                unpoison.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
                unpoison(block_at, copy - block_at)
            libc.free(block_at)
