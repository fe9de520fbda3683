"""The fork server: one warm `pytest` process per judging slot that forks a child per judgement.

The controller starts it (`servers.py`) as it would start a judging child: in the bubblewrap jail with
only its slot folder writable, in its own pids cgroup, with a scrubbed environment. It imports pytest,
pytest-kope and the operator's test modules and collects them once, with placeholders for the
candidate and the seeds; then, instead of running tests, it reads requests (one JSON line each) from
a pipe and answers each on another. It never builds or loads a kernel.

Per request it forks a child that, before anything of a candidate is loaded: starts its own session
(process group), closes the server's pipes, moves into the request's fresh work folder, replaces its
environment with the request's scrubbed one, lowers its rlimits and sends its output to its own log.
Then it either builds (`build`: compile and screen into its folder, load nothing) or runs the selected
items with the candidate and the seeds bound into the placeholders (`judge`), reporting signed events
exactly as a fresh child does (`child.py`). The server waits for it (killing it at the wall-clock
limit), then kills every other process left in its PID namespace, so nothing of one candidate is alive
when the next one starts. The server is not dumpable: a child cannot read or write its memory.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ...candidate import Candidate
from ...errors import ConfigError, KopeError
from ...settings import SEED
from ..protocol import sign
from ..request import JudgeRequest
from . import perfinputs

if TYPE_CHECKING:
    from ...toolchains.base import BuildsAhead

CANDIDATE_SLOT = "kope-candidate"  # the placeholder a judgement binds its candidate into
PR_SET_DUMPABLE = 4


def pytest_addoption(parser: pytest.Parser) -> None:
    """--kope-serve: this pytest process is a fork server."""
    parser.addoption(
        "--kope-serve", dest="kope_serve", help="(internal) REQ_FD,REPLY_FD,SEEDS,JAILED: be a fork server"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the fork server when --kope-serve is given."""
    given = config.getoption("kope_serve")
    if given:
        requests, replies, seeds, jailed = (int(x) for x in given.split(","))
        config.pluginmanager.register(Server(requests, replies, seeds, bool(jailed)), "kope-server")


class Server:
    """A warm pytest process that forks one judging child per request."""

    def __init__(self, requests: int, replies: int, seeds: int, jailed: bool):
        self.requests, self.replies, self.seeds, self.jailed = requests, replies, max(1, seeds), jailed
        self.forked = False  # True in a judging child, from the fork on

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "kope_candidate" in metafunc.fixturenames:
            metafunc.parametrize("kope_candidate", [CANDIDATE_SLOT], ids=[CANDIDATE_SLOT], indirect=True)
        if "kope_seed" in metafunc.fixturenames:
            slots = list(range(self.seeds))
            metafunc.parametrize("kope_seed", slots, ids=[f"kope-seed{i}" for i in slots], indirect=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        if session.testsfailed:  # collection errors: a fresh child reports them better
            self._reply({"event": "broken", "errors": session.testsfailed})
            return True
        _not_dumpable()
        _warm(session)
        self._reply({"event": "ready", "items": len(session.items), "pid": os.getpid()})
        with os.fdopen(self.requests, "r") as requests:
            for line in requests:
                request = json.loads(line)
                if request.get("op") == "stop":
                    break
                self._reply(self._serve(session, request))
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """A timing child times the inputs the server recorded instead of running the body again."""
        if self.forked and perfinputs.replay(pyfuncitem, pyfuncitem.config.stash[SEED]):
            return True
        return None

    def _reply(self, message: dict[str, Any]) -> None:
        os.write(self.replies, (json.dumps(message) + "\n").encode())

    def _serve(self, session: pytest.Session, request: dict[str, Any]) -> dict[str, Any]:
        expected = _build_key(session, request) if request["op"] == "build" else None
        if request["op"] == "judge":
            _record_inputs(session, JudgeRequest.from_json(request["spec"]))
        sys.stdout.flush()
        sys.stderr.flush()
        # Everything alive now is frozen out of the collector: a collection in the child would
        # otherwise write to every object's header and copy every page of the server's heap.
        gc.freeze()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            self._child(session, request)  # never returns
        code, timed_out = _wait(pid, float(request["limits"]["wall_s"]))
        strays = _kill_strays() if self.jailed else 0
        reply: dict[str, Any] = {
            "returncode": code,
            "timed_out": timed_out,
            "wall_s": time.monotonic() - started,
        }
        if expected is not None:  # checked here, with nothing of the build step left alive
            tc, key = expected
            folder = Path(request["work"]) / "builds" / key
            reply.update(key=key, refused=tc.check_built(folder) if folder.is_dir() else None)
        return {**reply, "strays": strays}

    def _child(self, session: pytest.Session, request: dict[str, Any]) -> None:
        code = 3
        self.forked = True
        try:
            os.setsid()
            os.close(self.requests)  # the pipes carry other candidates' keys: gone before any loading
            os.close(self.replies)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            work = Path(request["work"])
            os.chdir(work)
            os.environ.clear()
            os.environ.update(request["env"])
            tempfile.tempdir = None  # TMPDIR is this child's folder now
            _own_output(session.config, work / "child.log")
            run = build if request["op"] == "build" else judge
            code = run(session, request)
        except BaseException:  # noqa: BLE001 - whatever happens, the child ends here, with a status
            traceback.print_exc()
        finally:
            _flush()
            os._exit(code)


def judge(session: pytest.Session, request: dict[str, Any]) -> int:
    """Run the selected items with the candidate and seeds bound in, as a fresh judging child would."""
    from .plugin import Child

    config, asked = session.config, JudgeRequest.from_json(request["spec"])
    child = Child(config, asked, key=bytes.fromhex(request["key"]))
    config.pluginmanager.register(child, "kope-child")
    config.stash[SEED] = asked.seed
    items = bind(session.items, child.candidate, asked.seeds, config.stash[SEED])
    child.pytest_collection_modifyitems(config, items)
    session.items, session.testscollected = items, len(items)
    child.pytest_sessionstart(session)
    _restart_clock(config)
    for i, item in enumerate(items):
        nextitem = items[i + 1] if i + 1 < len(items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail or session.shouldstop:
            break
    status = 1 if session.testsfailed else 0
    config.hook.pytest_sessionfinish(session=session, exitstatus=status)
    return status


def _record_inputs(session: pytest.Session, asked: JudgeRequest) -> None:
    """Before a timing child is forked: run each selected perf test's body here once per seed, to
    keep its inputs (`perfinputs`). Requests with fresh-input seeds (correctness) record nothing."""
    from ...operator import base_nodeid, is_performance_test

    if asked.seeds or not asked.settings.record_inputs:
        return
    seed, selected = asked.seed, set(asked.tests)
    session.config.stash[SEED] = seed  # an item without a kope_seed slot draws from the session's seed
    for item in session.items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if (
            is_performance_test(item)
            and base_nodeid(item.nodeid) in selected
            and params.get("kope_seed", 0) == 0
        ):
            perfinputs.record(item, seed)


def _restart_clock(config: pytest.Config) -> None:
    """The log's "in N s" counts from this child's start, not the server's (pytest 8+; else left)."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None and hasattr(reporter, "_session_start"):
        from _pytest import timing as pytest_timing

        reporter._session_start = pytest_timing.Instant()


def bind(items: list[pytest.Item], candidate: Candidate, seeds: list[int], default: int) -> list[pytest.Item]:
    """The collected items with this judgement's candidate and seeds in place of the placeholders.

    Seed slot i takes the i-th seed; slots beyond the seeds given are dropped; with no seeds (timing)
    slot 0 takes the session's seed, as a fresh child's unparametrized `kope_seed` would.
    """
    kept = []
    for item in items:
        params = item.callspec.params if hasattr(item, "callspec") else {}
        if "kope_seed" in params:
            slot = params["kope_seed"]
            if slot >= max(1, len(seeds)):
                continue
            params["kope_seed"] = seeds[slot] if seeds else default
        if params.get("kope_candidate") == CANDIDATE_SLOT:
            params["kope_candidate"] = candidate
        kept.append(item)
    return kept


def build(session: pytest.Session, request: dict[str, Any]) -> int:
    """Compile and screen a candidate into `builds/` here; load nothing. Reports `built` or `build_failed`."""
    from ...toolchains import toolchain_of
    from ...toolchains.base import BuildsAhead
    from .building import build_failure, interface_of

    asked = JudgeRequest.from_json(request["spec"])
    op, candidate = asked.operator, asked.candidate
    key = bytes.fromhex(request["key"])
    with open(asked.results, "a") as out:
        try:
            tc = toolchain_of(session.config, candidate.toolchain)
            if not isinstance(tc, BuildsAhead):
                raise ConfigError(f"toolchain {tc.name} builds as it loads: no build step ahead")
            _, log = tc.compile(candidate, interface_of(op, candidate), Path.cwd() / "builds")
            event = {"event": "built", "candidate": candidate.hash, "log": log[-4000:]}
        except KopeError as e:
            kind, message = build_failure(op, candidate, e)
            event = {"event": "build_failed", "candidate": candidate.hash, "kind": kind}
            event["message"] = message[:4000]
        out.write(sign(key, json.dumps(event)) + "\n")
    return 0


def _build_key(session: pytest.Session, request: dict[str, Any]) -> tuple[BuildsAhead, str] | None:
    """(toolchain, the cache key) a build step's output must have, decided here, before the fork; None
    when the header does not parse (the step reports why)."""
    from ...toolchains import toolchain_of
    from ...toolchains.base import BuildsAhead
    from .building import interface_of

    asked = JudgeRequest.from_json(request["spec"])
    op, candidate = asked.operator, asked.candidate
    try:
        tc = toolchain_of(session.config, candidate.toolchain)
        if not isinstance(tc, BuildsAhead):
            return None
        return tc, tc.build_key(candidate, interface_of(op, candidate))
    except KopeError:
        return None


def _warm(session: pytest.Session) -> None:
    """Fill the caches every child would fill alike (toolchains, compiler versions, the committed
    kernels' cache keys) once, here; nothing is built or loaded."""
    from ...operator import operator_of
    from ...toolchains import toolchain_of
    from ...toolchains.base import BuildsAhead
    from .building import interface_of

    try:  # cffi's first cdef imports pycparser and builds its tables: tens of ms in every child
        import cffi

        cffi.FFI().cdef("void kope_warm(int);")
    except Exception:  # noqa: BLE001 - a toolchain without cffi
        pass
    # What every judging child would otherwise do first, each time: import the timing and replay code
    # and numpy's lazily loaded random module, and compile the MXCSR helper with gcc (~0.1 s a child).
    import numpy.random  # noqa: F401

    from ..measure import memops, physics, timing  # noqa: F401
    from . import fpstate

    fpstate.read()
    memops.available(), memops.streaming_bytes()  # compiled once here, not in every child
    ops = {op.name: op for item in session.items if (op := operator_of(item)) is not None}
    for op in ops.values():
        try:
            tc = toolchain_of(session.config, op.toolchain)
            if isinstance(tc, BuildsAhead):
                tc.build_key(op.baseline(), interface_of(op, op.baseline()))
        except Exception:  # noqa: BLE001 - only a head start: a child meets the same error and reports it
            pass


def _wait(pid: int, wall_s: float) -> tuple[int, bool]:
    """The child's exit code (-N: killed by signal N) and whether it ran past `wall_s` (then killed)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux before 5.3: look every few milliseconds
        fd = None
    if fd is not None:
        try:
            timed_out = not select.select([fd], [], [], wall_s)[0]
        finally:
            os.close(fd)
    else:
        deadline = time.monotonic() + wall_s
        while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.002)
        if ended[0]:
            return os.waitstatus_to_exitcode(ended[1]), False
        timed_out = True
    if timed_out:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), timed_out


def _kill_strays() -> int:
    """Kill every process in this jail's PID namespace but the server and the jail's init (pid 1).

    Whatever a child started (threads' processes, a fork bomb that left its process group) dies
    here, before the next judgement is forked. Only in the jail: outside it, /proc is the machine's.
    """
    me, found = os.getpid(), 0
    for _ in range(100):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not pids:
            break
        found += len(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
    return found


def _not_dumpable() -> None:
    """No process without CAP_SYS_PTRACE (none in the jail) may ptrace this one or open its memory,
    environment or file descriptors under /proc; forked children inherit it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _own_output(config: pytest.Config, log: Path) -> None:
    """This child's stdout and stderr (and pytest's capturing of them) go to its own log."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.stop_global_capturing()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable(file=sys.stderr)  # a crash's Python traceback goes to this log, too
    if capman is not None:
        capman.start_global_capturing()
        capman.suspend_global_capture()


def _flush() -> None:
    """Python's and C's buffered output (a kernel's printf) reach the log before os._exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)
    except OSError:
        pass
