"""Start one kernel server, stop it whenever it is not serving, and end it.

A server is a child of its test host: jailed when bubblewrap works here (`jail.py`), else a plain
child under the same seccomp filter; in cgroups of its own where they are writable (memory and
processes, limits that untouched `malloc` cannot see, unlike an address-space rlimit). Between
requests every process of it is stopped (SIGSTOP, and the host waits until every thread is), so no
thread of a kernel can work ahead, slow the other kernel of a paired timing, or finish late: a
kernel runs only inside a request, and a timed block's clock runs from before it is continued until
after it is stopped again.
"""

from __future__ import annotations

import itertools
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import KernelDied, KernelError, KernelTimeout
from . import jail
from .arena import Arena, Segment
from .wire import Channel, Closed, Garbled

CHANNELS = 2  # two threads may call at once (the differential check's overlapping calls)
STOP_WAIT_S = 5.0


@dataclass(frozen=True)
class Confinement:
    """How a server is held: the bubblewrap binary (None: unjailed), what it may read and write
    besides the interpreter, the modules it imports, its cgroups, and the longest a request may take."""

    bwrap: str | None
    readable: Sequence[Path | tuple[Path, str]] = ()  # (path, where the jail shows it)
    writable: Sequence[Path | tuple[Path, str]] = ()
    modules: tuple[str, ...] = ()
    cgroups: Sequence[Path] = ()
    call_timeout_s: float | None = None
    reports: Path | None = None  # where a sanitizer's runtime in the server writes what it found


@dataclass
class KernelProcess:
    """A running server: its channels, its arena, and the processes to stop and continue."""

    proc: subprocess.Popen[bytes]
    channels: list[Channel]
    confinement: Confinement
    arena: Arena = field(init=False)
    pids: list[int] = field(default_factory=list)
    _running: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _free: list[int] = field(default_factory=list)
    _channel_lock: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.arena = Arena(self._announce)
        self._free = list(range(len(self.channels)))
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        """A fresh id for something named to this server once (a timing's argument sets)."""
        return next(self._ids)

    @classmethod
    def start(
        cls, load: dict[str, Any], confinement: Confinement, env: Mapping[str, str]
    ) -> tuple[KernelProcess, dict[str, Any]]:
        """Start a server, have it load `load`, and stop it; (the process, its answer to the load)."""
        mine, theirs = zip(*(Channel.pair() for _ in range(CHANNELS)))
        fds = [s.fileno() for s in theirs]
        tail = [sys.executable, "-m", "pytest_kope.judge.kernel.serve", ",".join(map(str, fds))]
        cmd = (
            jail.command(
                confinement.bwrap, tail, confinement.readable, confinement.writable, confinement.modules
            )
            if confinement.bwrap
            else tail
        )
        cgroups = list(confinement.cgroups)

        def confine() -> None:  # in the child, before exec
            for group in cgroups:
                (group / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.Popen(  # its output goes where the host's goes: the judging child's log
            cmd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            pass_fds=fds,
            preexec_fn=confine if cgroups else None,
            start_new_session=True,
        )  # noqa: PLW1509
        for s in theirs:
            s.close()
        for channel in mine:
            channel.sock.settimeout(confinement.call_timeout_s)
        server = cls(proc, list(mine), confinement)
        server._running = 1  # it starts running; the load's answer stops it
        try:
            answer = server.ask({"load": load}, raw=True, on=0)
        except BaseException:
            server.close()
            raise
        return server, answer

    # -- running and stopped ------------------------------------------------------------------------
    def _processes(self) -> list[int]:
        """The server itself: the child, or, jailed, the process at the bottom of the jail's tree
        (bubblewrap and the jail's init only wait; a server can start no process of its own)."""
        if not self.confinement.bwrap:
            return [self.proc.pid]
        pid = self.proc.pid
        while True:
            below = [int(c) for tid in _tasks(pid) for c in _children(pid, tid)]
            if not below:
                return [pid] if pid != self.proc.pid else []
            pid = below[0]

    def _stop(self, stopped: Callable[[], None] = lambda: None) -> None:
        """SIGSTOP every thread of the server, call `stopped` (a clock's reading: the signal has been
        sent, and a running thread stops within microseconds), then wait until every thread is."""
        if not self.pids:
            self.pids = self._processes()
        for pid in self.pids:
            _signal(pid, signal.SIGSTOP)
        stopped()
        deadline = time.monotonic() + STOP_WAIT_S
        while not all(_stopped(pid) for pid in self.pids):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return  # gone, or stuck in the kernel: the next request finds out
            time.sleep(0)  # the stopping thread may need this core to take its signal

    def _continue(self) -> None:
        for pid in self.pids:
            _signal(pid, signal.SIGCONT)

    @contextmanager
    def running(self, stopped: Callable[[], None] = lambda: None) -> Iterator[None]:
        """The server continued for the duration (nested and concurrent uses count), stopped after;
        `stopped` is called once the last user's stop signal is sent (`_stop`)."""
        with self._lock:
            if self._running == 0:
                self._continue()
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    self._stop(stopped)
                else:
                    stopped()

    @contextmanager
    def channel(self) -> Iterator[int]:
        """A channel no other thread is using."""
        with self._channel_lock:
            while not self._free:
                self._channel_lock.wait()
            index = min(self._free)  # the first: a lone caller's calls run on the server's main thread
            self._free.remove(index)
        try:
            yield index
        finally:
            with self._channel_lock:
                self._free.append(index)
                self._channel_lock.notify()

    # -- requests -------------------------------------------------------------------------------------
    def ask(
        self, message: dict[str, Any], fds: list[int] | None = None, raw: bool = False, on: int | None = None
    ) -> dict[str, Any]:
        """Send a request on a free channel (or `on`) and wait for the answer; the server runs only
        meanwhile. Raises KernelDied, KernelTimeout or KernelError for what went wrong on its side."""
        if on is None:
            with self.channel() as index:
                return self.ask(message, fds, raw, index)
        channel = self.channels[on]
        if raw:  # the load: the server is running already, and stops once it answers
            with self._answer():
                try:
                    answer = channel.answer(channel.request(message, fds))
                finally:
                    with self._lock:
                        self._running -= 1
                        self._stop()
        else:
            with self._answer(), self.running():
                answer = channel.ask(message, fds)
        return self._checked(answer)

    def timed(
        self, message: dict[str, Any], on: int, clock: Callable[[], float]
    ) -> tuple[float, dict[str, Any]]:
        """Seconds from before `message` is sent until the stop signal is sent after its answer (and the
        answer): the
        request is queued while the server is stopped and it is continued after (one wake-up, not
        two), so every moment the server runs is inside the reading. Only when nothing else runs it."""
        channel, ended = self.channels[on], [0.0]
        with self._answer(), self._lock:
            began = clock()
            seq = channel.request(message)
            self._continue()
            try:
                answer = channel.answer(seq)
            finally:
                self._stop(lambda: ended.append(clock()))
        self._checked(answer)
        return ended[-1] - began, answer

    @contextmanager
    def _answer(self) -> Iterator[None]:
        """What went wrong on the server's side, as the kernel's fault."""
        timeout = self.confinement.call_timeout_s
        try:
            yield
        except TimeoutError:
            self.close()
            raise KernelTimeout(f"the kernel did not return within {timeout:.0f} s; killed") from None
        except (Closed, ConnectionError):
            raise KernelDied(self.death()) from None
        except Garbled as e:  # its own bytes on the channel: what it did next says more
            raise KernelDied(self.death(f"the kernel process wrote on its channel ({e})")) from None

    @staticmethod
    def _checked(answer: dict[str, Any]) -> dict[str, Any]:
        if "error" in answer:
            launches = answer.get("launches")
            raise KernelError(
                str(answer["error"])[:2000],
                str(answer.get("kind", ""))[:100],
                launches if isinstance(launches, list) else None,
            )
        return answer

    def _announce(self, segment: Segment, channel: int | None) -> None:
        self.ask({"op": "map", "id": segment.id, "size": segment.size}, [segment.fd], on=channel)

    def death(self, alive: str = "the kernel process stopped answering") -> str:
        """Why the server is gone, in one line (`alive`: why it is killed when it is not gone)."""
        self._continue()  # a stopped server cannot die of what it was doing
        try:
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.close()
            return alive
        if self.confinement.bwrap and 128 < code < 128 + 65:  # bwrap: its child's death by signal N
            code = -(code - 128)
        reported = _reported(self.confinement.reports)
        if code >= 0:
            return f"the kernel process exited with status {code}{reported}"
        sig = signal.Signals(-code)
        why = {
            signal.SIGSYS: " (a system call the jail forbids: sockets, new processes, tracing, signals to "
            "other processes, executable memory)",
            signal.SIGKILL: " (out of memory, or killed)",
        }.get(sig, "")
        return f"the kernel process was killed by {sig.name}{why}{reported}"

    def close(self) -> None:
        """Kill the server (a stopped one too) and everything in its jail."""
        for pid in [*self.pids, self.proc.pid]:
            _signal(pid, signal.SIGKILL)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for channel in self.channels:
            channel.close()


def _reported(folder: Path | None, lines: int = 4) -> str:
    """The first lines of what a sanitizer's runtime reported before the server died ("" if nothing):
    its error, the access and the kernel's frame (the frames below it, addresses without symbols in
    the interpreter, say nothing more)."""
    found = sorted(folder.iterdir()) if folder is not None and folder.is_dir() else []
    for path in found:  # the server could write here: no link is followed, no more than 64 KiB read
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            text = (
                f.read(1 << 16).decode(errors="replace").splitlines()
                if stat.S_ISREG(os.fstat(fd).st_mode)
                else []
            )
        said = [line.strip() for line in text if line.strip(" =")]
        said = [line for line in said if not line.startswith("#") or line.startswith("#0 ")]
        if said:
            return ": " + " | ".join(said[:lines])
    return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _children(pid: int, tid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
    except OSError:
        return []


def _stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (or the process is gone)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
        except OSError:
            continue
        if _state(fd) not in (None, b"T", b"t", b"Z", b"X"):
            return False
    return True


def _state(fd: int) -> bytes | None:
    """The state letter in a thread's open stat file, which is closed (None: the thread ended between
    the open and the read, ESRCH: a kernel the jail killed mid-call was judged `incorrect` with
    "ProcessLookupError" as its failure, instead of `crashed` by SIGSYS)."""
    try:
        stat = os.read(fd, 512)
    except OSError:
        return None
    finally:
        os.close(fd)
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
