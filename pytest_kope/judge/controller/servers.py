"""The controller's side of the fork servers (`forkserver.py`): start them, send judgements, clean up.

One server per judging slot (as many as correctness workers), each in its own jail whose only
writable path is its slot folder, each in its own pids cgroup. A slot judges one candidate at a time:
after every judgement the server kills what its child left in the jail's PID namespace, and this side
kills anything left in the server's cgroup that is not the server itself, so no process of one
candidate is alive when the next one starts, in any jail it could reach.

A server that dies or stops answering is killed and started afresh on the next request; the
judgement it was running is run again in a fresh process (a candidate that kills its server gains
nothing but a slower verdict). A server that cannot start (its collection fails) turns the pool off:
every judgement then runs in a fresh process, as with `--no-kope-fork-server`.
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import Interrupted
from . import files, sandbox
from .plan import Plan


class ServerDied(Exception):
    """The server ended or stopped answering mid-request; the judgement is to be run afresh."""


class ForkServer:
    """The controller's handle on one fork server: its pipes and its process."""

    def __init__(self, plan: Plan, index: int):
        self.plan, self.index = plan, index
        self.root = Path(tempfile.mkdtemp(prefix=f"kope-{plan.operator.name}-server{index}-"))
        self.slot = self.root / "slot"  # the only writable path in its jail; one work folder per request
        self.home = self.root / "home"  # its working directory, read-only in the jail
        self.slot.mkdir()
        self.home.mkdir()
        self.seeds = max(1, plan.settings.seeds)
        self.started: sandbox.Started | None = None
        self.requests = self.replies = -1
        self.buffer = b""
        self.own: set[int] = set()  # the server's own processes in its cgroup (bwrap, its init, python)
        self.count = 0
        self.start_s = 0.0

    def start(self) -> bool:
        """Start and wait until it has collected; False when it cannot (then judge in fresh processes)."""
        plan, began = self.plan, time.monotonic()
        req_r, self.requests = os.pipe()
        self.replies, rep_w = os.pipe()
        jailed = False  # a test host: it never loads a candidate (its kernels are served, `judge/kernel`)
        plugins = [a for name in ("pytest_kope.plugin", *plan.plugins) for a in ("-p", name)]
        cmd = [sys.executable, "-m", "pytest", *plugins, "-p", "pytest_kope.judge.child.forkserver"]
        cmd += ["--kope-serve", f"{req_r},{rep_w},{self.seeds},{int(jailed)}"]
        cmd += ["-p", "no:cacheprovider", "-o", "addopts=", "-q", "--rootdir", str(plan.rootdir)]
        cmd += [*(["-c", str(plan.inifile)] if plan.inifile else []), *map(str, plan.files)]
        env = {**plan.toolchain_env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        # the server's own limits: its CPU time is its whole life; a child lowers them to the plan's
        limits = replace(plan.limits, cpu_s=plan.limits.cpu_s * 100, processes=plan.limits.processes + 32)
        try:
            self.started = sandbox.start(
                cmd,
                self.slot,
                sandbox.scrubbed_environment(env, self.slot),
                limits,
                plan.children,
                sandbox.Placement(
                    pass_fds=(req_r, rep_w),
                    cwd=self.home,
                    log=self.root / "server.log",
                    die_with_parent=False,  # started from worker threads; it ends when its pipe closes
                    host=True,
                ),
            )
        finally:
            os.close(req_r)
            os.close(rep_w)
        try:
            ready = self._read(max(60.0, plan.limits.wall_s))
        except ServerDied:
            ready = {}
        if ready.get("event") != "ready":
            self.stop()
            return False
        self.own = _cgroup_pids(self.started.cgroup)
        self.start_s = time.monotonic() - began
        return True

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def work(self) -> Path:
        """A fresh work folder for one request, inside the slot (writable in this server's jail only)."""
        self.count += 1
        work = self.slot / f"w{self.count}"
        work.mkdir()
        return work

    def run(
        self, op: str, work: Path, spec: dict[str, Any], env: dict[str, str], key: bytes
    ) -> tuple[sandbox.Finished, dict[str, Any]]:
        """One request (op `judge` or `build`): how the child ended, and the server's whole reply (for a
        build: the cache `key` it decided and why it `refused` the output); raises ServerDied when the
        server ends or hangs."""
        limits = self.plan.limits
        request = {
            "op": op,
            "work": str(work),
            "spec": spec,
            "env": sandbox.scrubbed_environment(env, work),
            "key": key.hex(),
            "limits": {f: getattr(limits, f) for f in sandbox.Limits.__dataclass_fields__},
        }
        try:
            os.write(self.requests, (json.dumps(request) + "\n").encode())
        except OSError as e:
            self.stop()
            raise ServerDied(f"cannot reach the fork server: {e}") from None
        # a judge request may first run a perf test's body in the server (perfinputs): as long again
        reply = self._read(limits.wall_s * (2 if op == "judge" else 1) + 30.0)
        sandbox.sweep(self.started.cgroup if self.started else None, self.own)
        output = files.read_text(work / "child.log", tail=20000)
        return sandbox.Finished(reply["returncode"], reply["timed_out"], reply["wall_s"], output), reply

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies], [], [], left)[0]:
                self.stop()
                self.plan.children.check_stopping()
                raise ServerDied(f"the fork server did not answer within {timeout:.0f} s")
            chunk = os.read(self.replies, 65536)
            if not chunk:
                code = self._exit_status()
                self.stop()
                self.plan.children.check_stopping()  # killed by the interruption: no fresh process takes over
                raise ServerDied(f"the fork server ended ({code})")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _exit_status(self) -> str:
        try:
            code = self.started.proc.wait(timeout=2) if self.started else None
        except Exception:  # noqa: BLE001 - still running: it closed its pipe
            return "it closed its pipe"
        return f"exit status {code}"

    @property
    def alive(self) -> bool:
        return self.started is not None and self.started.proc.poll() is None

    def stop(self) -> None:
        """Kill the server and everything in its jail; its folders stay until `close`."""
        for fd in (self.requests, self.replies):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.requests = self.replies = -1
        self.buffer = b""
        if self.started is not None:
            sandbox.kill(self.started)
            self.started = None

    def close(self) -> None:
        if self.alive and self.started is not None:
            try:
                os.write(self.requests, b'{"op": "stop"}\n')
                self.started.proc.wait(timeout=5)
            except (OSError, Exception):  # noqa: BLE001 - a server that will not stop is killed below
                pass
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Pool:
    """Up to `size` warm servers for one operator; `acquire` hands one out, None when they are off."""

    def __init__(self, plan: Plan, size: int):
        self.plan, self.size = plan, max(1, size)
        self.idle: queue.Queue[ForkServer] = queue.Queue()
        self.servers: list[ForkServer] = []
        self.lock = threading.Lock()
        self.broken = ""  # why the servers are off (then every judgement runs in a fresh process)
        self.starting: list[threading.Thread] = []

    def warm(self) -> None:
        """Start the servers in the background, so the first judgements find them collected."""
        for _ in range(self.size):
            thread = threading.Thread(target=self._add, daemon=True)
            thread.start()
            self.starting.append(thread)

    def _add(self) -> None:
        with self.lock:
            if len(self.servers) >= self.size or self.broken:
                return
            server = ForkServer(self.plan, len(self.servers))
            self.servers.append(server)
        try:
            started = server.start()
        except Exception as e:  # noqa: BLE001 - a server that cannot start turns the servers off
            started, self.broken = False, f"the fork server could not start: {type(e).__name__}: {e}"
        except Interrupted:  # the run is ending: the judgement that waits for it raises the same
            started, self.broken = False, "the run was interrupted"
        if started:
            self.idle.put(server)
            return
        self.broken = self.broken or f"the fork server could not collect the tests:\n{server.log()}"
        server.close()
        self.idle.put(server)  # wakes a waiting acquire, which then sees `broken`

    def acquire(self) -> ForkServer | None:
        while not self.broken:
            try:
                server = self.idle.get(timeout=0.05 if len(self.servers) < self.size else 1.0)
            except queue.Empty:
                if len(self.servers) < self.size:
                    self._add()
                continue
            if self.broken:
                return None
            if not server.alive and not self._restart(server):
                return None
            return server
        return None

    def _restart(self, server: ForkServer) -> bool:
        try:
            if server.start():
                return True
        except Exception as e:  # noqa: BLE001
            self.broken = f"the fork server could not restart: {type(e).__name__}: {e}"
        self.broken = self.broken or f"the fork server could not restart:\n{server.log()}"
        self.idle.put(server)  # back in the pool, for close() and for waiters to see `broken`
        return False

    def release(self, server: ForkServer) -> None:
        self.idle.put(server)

    def close(self) -> None:
        for thread in self.starting:  # a server half started would otherwise outlive its pool
            thread.join()
        for server in self.servers:
            server.close()
        self.servers = []


def _cgroup_pids(cgroup: Path | None) -> set[int]:
    if cgroup is None:
        return set()
    try:
        return {int(p) for p in (cgroup / "cgroup.procs").read_text().split()}
    except OSError:
        return set()
