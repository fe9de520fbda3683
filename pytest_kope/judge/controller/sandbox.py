"""Run one untrusted child: own temp dir as cwd and HOME, scrubbed environment, rlimits, a wall-clock
time-out that kills the whole process group, and where the machine allows it a bubblewrap jail (no
network, read-only view of everything but the child's dir) and a pids cgroup (fork bombs).
"""

from __future__ import annotations

import functools
import os
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import Interrupted
from . import files

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)
# where programs, libraries and the locale are on the machine a child runs on (each node has its own)
HOST_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH")
KEEP = (
    *HOST_ENV,
    "CC",
    "CXX",
    "OMP_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
)  # what a toolchain's children need besides comes through the plan: Toolchain.passed_env()


@dataclass(frozen=True)
class Limits:
    """The resource limits of a judging child."""

    wall_s: float = 120.0
    cpu_s: int = 600
    address_space: int = 8 << 30
    # CUDA and NPU runtimes reserve terabytes of address space they never touch: under RLIMIT_AS the
    # device looks absent (seen: Triton fell back to its interpreter on an H200). For device children
    # the same figure caps RLIMIT_DATA instead, which counts memory that can be written, not reserved.
    device: bool = False
    file_size: int = 1 << 30
    processes: int = 256


class Children:
    """The children a run started and has not killed yet: what an interruption kills. The run owns
    one (`Interruption.children`) and its plans carry it to every place that starts a child. A copy
    never travels: a Ray task gets an empty one, since the children it starts are its node's."""

    def __init__(self) -> None:
        self.live: dict[int, Started] = {}  # by id() of the process
        self.stopping = threading.Event()

    def __reduce__(self) -> tuple[type[Children], tuple[()]]:
        return Children, ()

    def stop_all(self) -> None:
        """The run is interrupted: no child starts from now on, and every live one is killed with its
        process group and cgroup (a fork server's jail with it). Safe in a signal handler: no lock."""
        self.stopping.set()
        for started in list(self.live.values()):
            try:
                os.killpg(started.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            sweep(started.cgroup, set())

    def allow_starts(self) -> None:
        """A new run: children may start again (after an earlier run's `stop_all`)."""
        self.stopping.clear()

    def check_stopping(self) -> None:
        """Raise `Interrupted` once the run is interrupted: a judgement cut short yields no verdict."""
        if self.stopping.is_set():
            raise Interrupted("the run was interrupted")


@dataclass
class Finished:
    """How a sandboxed process ended: status, time-out, wall time and its output's tail."""

    returncode: int
    timed_out: bool
    wall_s: float
    output: str  # stdout+stderr tail

    @property
    def signal(self) -> int | None:
        """The signal that killed the child; bubblewrap reports it as exit status 128 + signal."""
        if self.returncode < 0:
            return -self.returncode
        if 128 < self.returncode < 128 + 65:
            return self.returncode - 128
        return None


def scrubbed_environment(extra: Mapping[str, str], home: Path) -> dict[str, str]:
    """Only what a build and a test need; nothing that looks like a key, token or password."""
    env = {k: v for k, v in os.environ.items() if k in KEEP and not SECRET_NAME.search(k)}
    env.update({k: v for k, v in extra.items() if not SECRET_NAME.search(k)})
    env.update(HOME=str(home), TMPDIR=str(home), PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
    return env


@functools.lru_cache(maxsize=1)
def bubblewrap() -> tuple[str | None, str]:
    """The bwrap binary if it works here, else None and why (said once, in the run's header)."""
    path = shutil.which("bwrap")
    if not path:
        return None, "bubblewrap not installed (apt-get install bubblewrap): no network/filesystem jail"
    probe = subprocess.run(
        jail_command(path, [], ["true"]),
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return None, f"bubblewrap cannot create namespaces here ({probe.stderr.strip()[:120]}): no jail"
    return path, (
        "bubblewrap: a kernel server sees only the interpreter, its libraries and its kernel "
        "(no home, no repo, no socket, private /tmp and /proc, every namespace its own)"
    )


@functools.lru_cache(maxsize=1)
def pids_cgroup_root() -> Path | None:
    """A writable cgroup with a pids controller to contain fork bombs, or None."""
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            probe = root / f"kope-probe-{os.getpid()}"
            try:
                probe.mkdir()
                ok = (probe / "pids.max").exists()
                probe.rmdir()
            except OSError:
                continue
            if ok:
                _sweep_stale_cgroups(root)
                return root
    return None


def _sweep_stale_cgroups(root: Path) -> None:
    """Remove the empty cgroups of controllers that died (a SIGKILLed run cannot clean up after itself)."""
    for path in root.glob("kope-*-*"):
        try:
            pid = int(path.name.split("-")[1])
            os.kill(pid, 0)
            continue  # its controller is alive
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            path.rmdir()  # fails while processes are still in it: left alone
        except OSError:
            pass


def jail_command(
    bwrap: str, writable: Sequence[Path], tail: Sequence[str], readonly_dev: bool = False
) -> list[str]:
    """bubblewrap: everything read-only but `writable`, fresh /dev and /proc, no network, own PID and
    IPC namespaces, and no capabilities (run as root, bubblewrap would otherwise keep them all, and
    CAP_SYS_ADMIN remounts the read-only view writable). `readonly_dev` for a jail that outlives one
    candidate (a fork server): nothing one leaves in /dev reaches the next."""
    binds = [a for p in writable for a in ("--bind", str(p), str(p))]
    return [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        *(["--remount-ro", "/dev"] if readonly_dev else []),
        "--proc",
        "/proc",
        *binds,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--cap-drop",
        "ALL",
        *tail,
    ]


@dataclass
class Started:
    """A sandboxed process on its way: what `wait` and `kill` need."""

    proc: subprocess.Popen[bytes]
    cgroup: Path | None
    jailed: bool
    log: Path
    start: float
    children: Children  # the run's registry it is in until killed


def apply_rlimits(limits: Limits) -> None:
    """CPU time, address space, file size, processes, no core: in a child, before any candidate code."""
    for res, value in (
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_DATA if limits.device else resource.RLIMIT_AS, limits.address_space),
        (resource.RLIMIT_FSIZE, limits.file_size),
        (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(res, (value, value))


@dataclass(frozen=True)
class Placement:
    """Where a jailed process sits beside its work folder: other writable paths, the pipes it inherits,
    its working directory (default: the work folder), /dev read-only, where its output goes (default
    `work`/child.log), and whether it dies with the *thread* that started it (PR_SET_PDEATHSIG): off
    for a process that outlives that thread (a fork server, which ends when its pipe does)."""

    writable: Sequence[Path] = ()
    pass_fds: Sequence[int] = ()
    cwd: Path | None = None
    readonly_dev: bool = False
    log: Path | None = None
    die_with_parent: bool = True
    # A test host: it loads no candidate code (its kernels are served by jailed kernel servers,
    # `judge/kernel`), so it runs as the user's own pytest does: no jail, the user's rlimits.
    host: bool = False


def start(
    cmd: Sequence[str],
    work: Path,
    env: Mapping[str, str],
    limits: Limits,
    children: Children,
    place: Placement = Placement(),
) -> Started:
    """Start `cmd` jailed with `work` (and `place.writable`) the only writable paths, in its own process
    group and pids cgroup, under `limits`; one of the run's `children` until it is killed."""
    children.check_stopping()
    jail = None if place.host else bubblewrap()[0]
    cwd = place.cwd or work
    full = list(cmd)
    if jail:
        tail = [*(["--die-with-parent"] if place.die_with_parent else []), "--chdir", str(cwd), "--", *cmd]
        full = jail_command(jail, [work, *place.writable], tail, place.readonly_dev)
    cgroup = _make_cgroup(limits.processes)

    def confine() -> None:  # runs in the child between fork and exec
        os.setsid()
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        if not place.host:
            apply_rlimits(limits)

    log = place.log or work / "child.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            full,
            cwd=cwd,
            env=dict(env),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=confine,
            pass_fds=tuple(place.pass_fds),
        )  # noqa: PLW1509
    started = children.live[id(proc)] = Started(proc, cgroup, bool(jail), log, time.monotonic(), children)
    if children.stopping.is_set():  # interrupted while it started: `stop_all` may have missed it
        kill(started)
        children.check_stopping()
    return started


def wait(started: Started, timeout: float | None) -> Finished:
    """Wait up to `timeout` seconds, then kill whatever is left of it; never raises for the child."""
    proc, timed_out = started.proc, False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    kill(started)
    started.children.check_stopping()  # killed by `stop_all`, or its verdict would come too late
    output = files.read_text(started.log, tail=20000)  # never through a link the child planted
    code = proc.returncode
    if started.jailed and 128 < code < 128 + 65:  # bwrap reports its child's death by signal N as 128+N
        code = -(code - 128)
    return Finished(code, timed_out, time.monotonic() - started.start, output)


def kill(started: Started) -> None:
    """Kill the process group and everything in its cgroup, then remove the cgroup."""
    _kill_all(started.proc.pid, started.cgroup)
    started.proc.wait()
    started.children.live.pop(id(started.proc), None)
    _remove_cgroup(started.cgroup)
    started.cgroup = None


def sweep(cgroup: Path | None, keep: set[int]) -> int:
    """Kill every process in `cgroup` but `keep` (a fork server's own); how many were found."""
    if cgroup is None:
        return 0
    found = 0
    for _ in range(50):
        try:
            pids = {int(p) for p in (cgroup / "cgroup.procs").read_text().split()} - keep
        except OSError:
            return found
        if not pids:
            break
        found += len(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    return found


def run(
    cmd: Sequence[str], work: Path, env: Mapping[str, str], limits: Limits, children: Children
) -> Finished:
    """Run `cmd` jailed in `work`, `work` its only writable path; never raises for what it does."""
    return wait(start(cmd, work, env, limits, children), limits.wall_s)


def _kill_all(pgid: int, cgroup: Path | None) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:  # stragglers that left the process group (setsid in a fork bomb)
        for _ in range(50):
            pids = (cgroup / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)


def _make_cgroup(max_pids: int) -> Path | None:
    root = pids_cgroup_root()
    if root is None:
        return None
    path = root / f"kope-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_pids))
    except OSError:
        return None
    return path


def _remove_cgroup(path: Path | None) -> None:
    if path is not None:
        for _ in range(50):
            try:
                path.rmdir()
                return
            except OSError:
                time.sleep(0.02)
