"""Reading what a child left without following a link it could have planted.

A link in a folder a child can write (its work folder, a build's output) could point the controller
at its own secrets (`/proc/self/environ`) or anywhere else it may read; opened with O_NOFOLLOW, a
link is refused instead, and a file that is not a regular file is not read either.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_bytes(path: Path, tail: int | None = None) -> bytes:
    """The file's bytes (its last `tail` only), or b"" when it is missing, a link or not a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        if tail is not None:
            f.seek(max(0, os.fstat(fd).st_size - tail))
        return f.read()


def read_text(path: Path, tail: int | None = None) -> str:
    """`read_bytes` as text."""
    return read_bytes(path, tail).decode(errors="replace")


def copy(source: Path, target: Path) -> bool:
    """Copy a regular file without following links (False: nothing copied)."""
    data = read_bytes(source)
    if not data and not (source.is_file() and not source.is_symlink()):
        return False
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True
