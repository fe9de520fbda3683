"""Build tools run on a candidate's source: the compiler, the repo's own build command.

In a judging build step (the launcher sets KOPE_JAIL_BUILDS=1 where the run has a jail) they run in a jail of their own, as a
kernel server does (`judge/kernel/jail.py`, without the seccomp filter: a build starts processes):
the interpreter, the system's programs and the tools on PATH outside home directories read-only, the
sources and headers a build reads read-only, its own build folder writable, and nothing else of the
host, so an `#include "/home/you/.ssh/id_rsa"` finds nothing and a build script reaches no socket.
Outside a judging process (a plain `pytest`, doctor) they run as the user runs them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

JAIL_ENV = "KOPE_JAIL_BUILDS"


def run(
    cmd: Sequence[str],
    cwd: Path,
    timeout: float,
    env: Mapping[str, str] | None = None,
    readable: Sequence[Path | str] = (),
) -> subprocess.CompletedProcess[str]:
    """`cmd` in `cwd` (writable), its output captured as text; raises subprocess.TimeoutExpired."""
    full = list(cmd)
    if os.environ.get(JAIL_ENV) == "1":
        from ..judge.controller.sandbox import bubblewrap
        from ..judge.kernel import jail

        bwrap, _ = bubblewrap()
        if bwrap:
            full = jail.command(bwrap, full, [*jail.tool_paths(), *readable], [cwd], cwd=cwd)
    return subprocess.run(
        full, cwd=cwd, env=None if env is None else dict(env), capture_output=True, text=True, timeout=timeout
    )
