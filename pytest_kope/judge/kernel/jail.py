"""What a kernel server sees: the interpreter and the libraries it imports, read-only, the files of
the one kernel it serves, a private /tmp, /dev/shm and /proc, and nothing else of the host.

No home directory (the interpreter's own folder excepted, where it lives under one), no /run or
/var/run or any other socket, no /etc but the dynamic loader's cache, no repo, no other candidate's
folder, no work folder of its host. Every namespace is its own (user, pid, net, ipc, uts, cgroup), it
dies with its host, runs in a session of its own and can gain no privilege.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
LOADER = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
CPU_INFO = ("/sys/devices/system/cpu", "/sys/devices/system/node")  # OpenMP, torch: how many cores


@functools.lru_cache(maxsize=8)
def interpreter_paths(modules: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The folders the interpreter needs, and those of `modules` (imported by the server), most
    general first; folders under another already listed are left out."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    found += [p for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"]) if p]
    found.append(str(Path(__file__).resolve().parents[2]))  # pytest_kope itself (an editable install's)
    for name in modules:
        spec = importlib.util.find_spec(name)
        for place in (spec.submodule_search_locations or []) if spec else []:
            found.append(str(Path(place).resolve()))
    kept: list[str] = []
    for path in sorted({os.path.realpath(p) for p in found if os.path.isdir(p)}, key=len):
        if not any(path == k or path.startswith(k + os.sep) for k in kept):
            kept.append(path)
    return tuple(kept)


def tool_paths() -> tuple[str, ...]:
    """The folders on PATH outside home directories: where a build finds its compiler and tools."""
    homes = (os.path.realpath(os.path.expanduser("~")), "/home", "/root")
    found = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        real = os.path.realpath(entry) if entry else ""
        if real and os.path.isdir(real) and not any(real == h or real.startswith(h + os.sep) for h in homes):
            found.append(real)
    return tuple(found)


def command(
    bwrap: str,
    tail: Sequence[str],
    readable: Sequence[Path | str | tuple[Path | str, str]] = (),
    writable: Sequence[Path | str | tuple[Path | str, str]] = (),
    modules: tuple[str, ...] = (),
    cwd: Path | str = "/tmp",
) -> list[str]:
    """The bubblewrap command line that runs `tail` in the kernel server's view (a build step's,
    with `cwd` writable among `writable`). A `(path, inside)` pair shows `path` at `inside`."""
    ro = [*SYSTEM, *LOADER, *CPU_INFO, *interpreter_paths(modules), *readable]
    # --as-pid-1: the jail holds the server alone (no init of bubblewrap's beside it to reach)
    args = [bwrap, "--unshare-all", "--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # the private mounts first: a folder bound below (a build under /tmp) is then seen through them
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    for path in ro:
        source, inside = path if isinstance(path, tuple) else (path, path)
        args += ["--ro-bind-try", str(source), str(inside)]
    for path in writable:
        source, inside = path if isinstance(path, tuple) else (path, path)
        args += ["--bind", str(source), str(inside)]
    args += ["--chdir", str(cwd), "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    return [*args, "--", *tail]
