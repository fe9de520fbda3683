"""Cgroups for one kernel server: memory and processes bounded where the kernel cannot see it.

An address-space rlimit fails a `malloc` the kernel never touches, which a user's process would get:
a kernel could tell the judge from a user by it. A memory cgroup counts only pages really used, so
reserving is free here as it is for the user, and using too much ends the server (SIGKILL, reported
as out of memory). cgroup v2 where it is mounted and writable, else v1's memory and pids hierarchies;
none writable: no cgroup (the wall-clock limit and the seccomp filter still hold).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
MEMORY_BYTES = 8 << 30
PIDS = 512  # threads count: an OpenMP team per core, many times over


def make(memory: int = MEMORY_BYTES, pids: int = PIDS) -> list[Path]:
    """Fresh cgroups for one server (empty when none can be made)."""
    name = f"kope-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if (ROOT / "cgroup.controllers").exists():  # v2: one group, both limits
        return _one(ROOT / name, {"memory.max": memory, "pids.max": pids})
    groups = []
    for hierarchy, limits in (
        ("memory", {"memory.limit_in_bytes": memory}),
        ("pids", {"pids.max": pids}),
    ):
        groups += _one(ROOT / hierarchy / name, limits)
    return groups


def writable() -> bool:
    """Whether a server's cgroups can be made here."""
    groups = make()
    remove(groups)
    return bool(groups)


def _one(path: Path, limits: dict[str, int]) -> list[Path]:
    try:
        path.mkdir()
    except OSError:
        return []
    try:
        for key, value in limits.items():
            (path / key).write_text(str(value))
    except OSError:
        remove([path])
        return []
    return [path]


def out_of_memory(groups: list[Path]) -> bool:
    """Whether a server in `groups` hit its memory limit."""
    for group in groups:
        for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                lines = (group / name).read_text().split("\n")
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                if len(parts) == 2 and parts[0] == key and int(parts[1]) > 0:
                    return True
    return False


def remove(groups: list[Path]) -> None:
    """Remove emptied cgroups (one still holding a process stays)."""
    for group in groups:
        try:
            group.rmdir()
        except OSError:
            pass
