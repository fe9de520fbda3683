"""A C/C++ candidate built with AddressSanitizer and UndefinedBehaviorSanitizer, for one judging child.

A kernel that reads past its buffers is right wherever the bytes past them happen to be harmless:
in the judge's shared arena (the next argument), and in most of a user's calls, until the buffer
ends at a page. Its tests and the differential check cannot see the read; a sanitizer can. A
candidate that passed its tests is judged once more in a child of its own (`controller/runner.py`)
whose environment sets `ENV`: there the C toolchain compiles it with `FLAGS`, lets the library
import the sanitizers' runtime symbols, and serves it with the runtime preloaded into its kernel
server (`LD_PRELOAD`; the instrumented library cannot be loaded otherwise), each array copied into
memory the runtime watches (`judge/kernel/redzones.py`). The runtime's report goes to a folder the
host reads when the server dies, and the test that made the call fails with its first lines.

The runtime is told not to symbolize (that starts a process, which the server's filter forbids) and
not to look for leaks (LeakSanitizer stops the world with ptrace, forbidden too; a kernel's leak is
not a wrong result).
"""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path

from ..judge.kernel import jail

ENV = "KOPE_C_SANITIZE"  # "1" in a judging child that builds and serves its C kernels sanitized
FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")
SYMBOLS = ("__asan_*", "__ubsan_*")  # what an instrumented library imports from the runtime
OPTIONS = "detect_leaks=0:symbolize=0:print_stacktrace=0:halt_on_error=1"


def wanted() -> bool:
    """Whether this process builds and serves its C kernels sanitized (read at each use: a fork
    server's child gets its environment after the toolchain was made)."""
    return os.environ.get(ENV) == "1"


@functools.lru_cache(maxsize=4)
def runtime(cc: str) -> Path | None:
    """The AddressSanitizer runtime `cc` links against (`-print-file-name=libasan.so`), or None
    when it has none (a compiler that only echoes the name back did not find it)."""
    try:
        out = subprocess.run(
            [cc, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(out)
    return path.resolve() if path.is_absolute() and path.exists() else None


def served(cc: str) -> tuple[dict[str, str], Path, tuple[Path, ...]]:
    """The server's variables that load and set up the runtime, the folder it reports into (in the
    judging child's build folder, removed with its work) and the folder the jail must show besides
    the system's for the runtime (none when it lies in the system's: bubblewrap itself then finds it
    at the same path)."""
    found = runtime(cc)
    if found is None:
        raise FileNotFoundError(f"{cc} has no AddressSanitizer runtime (libasan.so)")
    where = os.environ.get("KOPE_BUILD_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
    reports = Path(tempfile.mkdtemp(prefix="kope-sanitizer-", dir=where))
    options = f"{OPTIONS}:log_path={reports}/report"
    env = {"LD_PRELOAD": str(found), "ASAN_OPTIONS": options, "UBSAN_OPTIONS": options}
    system = any(str(found).startswith(place + "/") for place in jail.SYSTEM)
    return env, reports, () if system else (found.parent,)
