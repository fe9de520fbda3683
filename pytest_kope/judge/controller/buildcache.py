"""Build once: one content-addressed build cache per run, written only by the controller.

A candidate is compiled by a *build step*: a child forked by a fork server, jailed like any judging
child, that compiles and screens into its own work folder and loads nothing. The server decides the
cache key before the fork and checks the output after the step and everything it started are dead;
then this module moves exactly that key's folder into the cache. Judging children see the cache
read-only (it is outside every jail's writable paths) and load from it; what the cache lacks they
build privately, and that never enters the cache. So a candidate can neither plant a library under
another candidate's key nor swap its own after it was screened.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Failure:
    """A build that failed in the cache: its outcome kind and message."""

    kind: str  # compile_failed | rejected | crashed
    message: str


class BuildCache:
    """The run's read-only cache of built candidates, filled by build steps before judging."""

    def __init__(self, name: str):
        self.root = Path(tempfile.mkdtemp(prefix=f"kope-{name}-builds-"))
        self.keys: dict[str, str] = {}  # candidate hash -> key of its folder in the cache
        self.failures: dict[str, Failure] = {}
        self.builds = 0  # build steps run (each candidate at most once)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, digest: str) -> threading.Lock:
        """One build of a candidate at a time (two judgements of it wait for the first's build)."""
        with self._guard:
            return self._locks.setdefault(digest, threading.Lock())

    def known(self, digest: str) -> bool:
        return digest in self.keys or digest in self.failures

    def adopt(self, digest: str, work: Path, key: str) -> bool:
        """Move `work`/builds/`key` into the cache (atomically); False when the step left no such folder."""
        source = work / "builds" / key
        if not source.is_dir() or source.is_symlink():
            return False
        target = self.root / key
        try:
            os.rename(source, target)
        except OSError:  # the same key is in already (another candidate with the same build)
            if not target.is_dir():
                return False
        self.keys[digest] = key
        return True

    def fail(self, digest: str, kind: str, message: str) -> Failure:
        self.failures[digest] = Failure(kind, message)
        return self.failures[digest]

    def env(self) -> dict[str, str]:
        return {"KOPE_BUILD_CACHE": str(self.root)}

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
