"""One optimize run per `.kope/` at a time, and word of other runs on this machine.

Two runs on one repo time on the same cores, so each one's figures are the other's noise (seen: one
candidate "verified" at 7.6x by one run and 3.9x by the other), and both write the same graph and
branches. The second run waits for the first, or with `--kope-no-wait` refuses (a usage error). The lock
is an flock on `.kope/run.lock`: the kernel releases it when its holder ends, however it ends, so a
killed run never leaves a stale lock; the file names the holder (pid, run id, start) for the message.

Runs in other repos on this machine time on the same cores too. Each run holds an flock on a file of
its own under the user's cache folder, and a starting run names the live runs it finds there. It does
not wait for them: a lock held only while timing would still let the other run's builds and
correctness children load the cores, and one held for a whole run would serialize unrelated repos (a
CI machine's jobs). The paired, interleaved rounds and their confidence bound are what absorb the
load; the line tells the user the figures were measured on a shared machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..judge.controller import sandbox

POLL_S = 0.5  # how often a waiting run tries the lock (and notices Ctrl-C)


def _holder(run_id: str, repo: Path) -> bytes:
    """What a lock file says about its holder."""
    started = datetime.now().isoformat(timespec="seconds")
    return json.dumps({"pid": os.getpid(), "run_id": run_id, "started": started, "repo": str(repo)}).encode()


def _describe(raw: bytes) -> str:
    """'run 20250101-120000-abcdef (pid 123, started 2025-01-01T12:00:00)', or what is known of it."""
    try:
        h: dict[str, Any] = json.loads(raw)
        return f"run {h['run_id']} (pid {h['pid']}, started {h['started']})"
    except (ValueError, KeyError, TypeError):
        return "another run (it has not written its name yet)"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _write(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


class RunLock:
    """The repo's lock (`.kope/run.lock`) and this run's entry among the machine's runs."""

    def __init__(self, kope_dir: Path, run_id: str, repo: Path):
        self.path = kope_dir / "run.lock"
        self.me = _holder(run_id, repo)
        self.fd = -1
        self.machine: Path | None = None  # this run's file among the machine's runs
        self.machine_fd = -1

    def acquire(self, wait: bool, say: Callable[[str], None], stopping: sandbox.Children) -> None:
        """Hold the repo's lock; wait for its holder (saying which run that is) or, when not `wait`,
        refuse with a ConfigError. Raises `Interrupted` when Ctrl-C comes while it waits."""
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(self.fd):
            holder = _describe(os.pread(self.fd, 4096, 0))
            if not wait:
                self.release()
                raise ConfigError(
                    f"{self.path}: {holder} is optimizing this repo; one run at a time (both would time on "
                    "the same cores): wait for it, or run without --kope-no-wait to wait for it"
                )
            say(f"kope: waiting for {holder} to end: one optimize run per repo at a time ({self.path})")
            while not _try_lock(self.fd):
                stopping.check_stopping()
                time.sleep(POLL_S)
        _write(self.fd, self.me)

    def others_on_machine(self) -> list[str]:
        """Register this run among the machine's runs; the other live ones, described. Nothing where
        no folder for them can be made: the word is a courtesy, not a condition of the run."""
        folder = machine_folder()
        if folder is None:
            return []
        others = []
        for path in sorted(folder.glob("*.lock")):
            with contextlib.suppress(OSError, ValueError, AttributeError), open(path, "rb") as f:
                if _try_lock(f.fileno()):  # its run ended without removing it (killed)
                    path.unlink(missing_ok=True)
                else:
                    raw = f.read()
                    where = json.loads(raw).get("repo", "?") if raw else "?"
                    others.append(f"{_describe(raw)} in {where}")
        self.machine = folder / f"{os.getpid()}-{time.time_ns()}.lock"
        self.machine_fd = os.open(self.machine, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.machine_fd, fcntl.LOCK_EX)
        _write(self.machine_fd, self.me)
        return others

    def release(self) -> None:
        """Give up both locks (the kernel would at exit too)."""
        if self.machine is not None:
            self.machine.unlink(missing_ok=True)
            os.close(self.machine_fd)
            self.machine, self.machine_fd = None, -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def machine_folder() -> Path | None:
    """Where this machine's runs register: the user's cache folder, else the temp folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    for base in (Path(cache) / "pytest-kope", Path(tempfile.gettempdir()) / f"pytest-kope-{os.getuid()}"):
        try:
            (base / "runs").mkdir(parents=True, exist_ok=True)
            return base / "runs"
        except OSError:
            continue
    return None


def say_others(others: list[str], say: Callable[[str], None]) -> None:
    """One line per other run on this machine: they share the cores this run times on."""
    for other in others:
        say(
            f"kope: {other} is also running on this machine: both time on the same cores, so timings are "
            "noisier and a gain near --kope-min-gain may not hold; for clean figures run one at a time"
        )
