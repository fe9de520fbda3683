"""Run one judging child, forked from a warm fork server or started fresh, and read its verdict.

With fork servers on (the default, for toolchains whose tests a fork can carry), a candidate is first
built once by a build step (`buildcache.py`), then every child that judges it forks from a server
and loads it from the run's read-only build cache. A fresh child (`--no-kope-fork-server`, the
verification of a winner, a server that cannot serve) is a new `python -m pytest` in its own jail
that builds privately, as before. Either child reports the same signed events, read the same way.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path

from ...candidate import Candidate
from ...toolchains import tools
from ...toolchains.devices import visible_devices_env
from ..arrays import DEFAULT_RTOL
from ..kernel import hosting
from ..outcome import Judged, Outcome
from ..protocol import read_events
from ..request import JudgeRequest, Shrink
from . import environments, files, sandbox
from .buildcache import BuildCache
from .judgement import Request
from .plan import Plan
from .servers import ForkServer, Pool, ServerDied
from .verdict import read

# Toolchains whose tests a fork carries: Triton and torch set up threads and device state (CUDA, NPU)
# that a forked child cannot use, so their children always start fresh.
FORK_SAFE = frozenset({"c"})


class Launcher:
    """Starts judging children: forked from warm servers, or fresh sandboxed processes."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.forking = plan.settings.fork_server and plan.operator.toolchain in FORK_SAFE
        self.fresh = not self.forking
        self.pool: Pool | None = None
        self.cache: BuildCache | None = None
        self.jit_root: Path | None = None  # per-candidate JIT caches (`_jit_cache`)
        self.notes: list[str] = []  # said once: why the servers are off
        self.ceilings = (
            plan.ceilings
        )  # measured bandwidth/FMA ceilings: raised by the judge (`Judge._ceilings_rose`)
        self.remote = plan.executor  # None: judge here; else where it runs each child (`executors.py`)
        self.private = False  # every build private: no JIT cache shared between children
        self.timed_rtol = plan.operator.rtol if plan.operator.rtol is not None else DEFAULT_RTOL  # `Judge`'s

    def fresh_processes(self) -> None:
        """From now on every child starts fresh and builds privately (the verification of a winner)."""
        self.fresh = self.private = True

    def _server(self, seeds: list[int]) -> ForkServer | None:
        if self.fresh:
            return None
        if self.pool is None:
            self.pool = Pool(self.plan, self.plan.jobs)
            self.cache = BuildCache(self.plan.operator.name)
            self.pool.warm()
        if len(seeds) > max(1, self.plan.settings.seeds):  # more seeds than the servers collected slots for
            return None
        server = self.pool.acquire()
        self.plan.children.check_stopping()  # servers turned off by an interruption are no fault to report
        if server is None and self.pool.broken and not self.notes:
            self.notes.append(f"fork servers off, judging in fresh processes: {self.pool.broken[:2000]}")
        return server

    def judge(self, request: Request) -> Judged:
        """Judge in a child: on another executor (Ray) when the plan has one, else on this machine."""
        if self.remote is not None:  # another executor (Ray) runs the child, and reserves its node
            return self._elsewhere(request)
        with self._reserved(request.reference is not None):
            return self._here(request)

    def _reserved(self, timing: bool) -> AbstractContextManager[object]:
        """The node held whole while a host-timed kernel is timed (operators judged concurrently
        share it); a share of it for anything else. Nothing to hold without a reservation."""
        node = self.plan.node
        if node is None or self.plan.limits.device:
            return nullcontext()
        held: AbstractContextManager[object] = node.whole() if timing else node.share()
        return held

    def _here(self, request: Request) -> Judged:
        """Judge in a child on this machine: forked from a warm server, or fresh."""
        server = self._server(request.seeds)
        if server is None:
            return self._run(None, request)
        try:
            built = self._build(server, request.candidate)
            if isinstance(built, Judged):
                return built
            for other in (request.reference, request.oracle):
                if other is not None:
                    self._build(server, other)
            judged = self._run(server, request)
            judged.phases["build"] = judged.phases.get("build", 0.0) + built
            judged.seconds += built
            return judged
        except ServerDied as e:  # it died or hung under this candidate: judged afresh, nothing lost
            self.notes.append(f"{e}; judged {request.candidate.short} in a fresh process")
            return self._run(None, request)
        finally:
            assert self.pool is not None  # a server came from it
            self.pool.release(server)

    def _run(self, server: ForkServer | None, request: Request) -> Judged:
        plan, record = self.plan, request.record
        work = server.work() if server else Path(tempfile.mkdtemp(prefix=f"kope-{plan.operator.name}-"))
        try:
            key = secrets.token_bytes(32)
            into = (work / "recorded" if server else record) if record else None
            spec = self._spec(request, work, into)
            timing = request.reference is not None
            env = self.child_env(
                work,
                request.device,
                request.environment,
                cached=server is not None,
                sanitize=request.sanitize,
            )
            jit = self._jit_cache(request.candidate) if server is None else None
            if jit is not None:
                env[str(plan.jit_cache_env)] = str(jit)
            began = time.monotonic()
            if server is not None:
                finished, _ = server.run("judge", work, spec.to_json(), env, key)
            else:
                finished = self.run_fresh(spec, env, key, work, record, jit)
            ended = time.monotonic()
            if server is not None and record is not None:
                _take(work / "recorded", record)
            self._keep(request.candidate, work, "perf.log" if timing else "correctness.log")
            return read(request, finished, work, key, (began, ended))  # last: one stay in this module a child
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _elsewhere(self, request: Request) -> Judged:
        """Judge through another executor: the same fresh child runs on a worker node, which sends
        back what it wrote (`Ran`); the verdict is read and decided here, as for a local child."""
        assert self.remote is not None, "judged elsewhere only with an executor"
        work = Path(tempfile.mkdtemp(prefix=f"kope-{self.plan.operator.name}-"))
        try:
            key = secrets.token_bytes(32)
            timing = request.reference is not None
            spec = self._spec(request, work, work / "recorded" if request.record else None)
            sent = time.monotonic()
            ran = self.remote.judge(self.plan, spec, key, work, timing=timing)
            took = time.monotonic() - sent
            ran.unpack(work)
            self.notes += [f"{note} ({request.candidate.short})" for note in ran.notes]  # not the candidate's
            if request.record is not None:
                _take(work / "recorded", request.record)
            self._keep(request.candidate, work, "perf.log" if timing else "correctness.log")
            judged = read(request, ran.finished, work, key, ran.clock)
            judged.phases["executor"] = max(0.0, took - ran.finished.wall_s)  # what the executor added
            return judged
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _spec(self, request: Request, work: Path, record: Path | None) -> JudgeRequest:
        """What the child is asked, in the one form that travels (`..request`)."""
        plan, reference = self.plan, request.reference
        return JudgeRequest(
            candidate=request.candidate,
            operator=plan.operator,
            results=str(work / "results.jsonl"),
            tests=request.tests,
            seeds=request.seeds,
            reference=reference,
            record=str(record) if record else None,
            replay=str(request.replay_from) if request.replay_from else None,
            rtol=self.timed_rtol,
            ceilings=self.ceilings if reference is not None else None,
            settings=plan.settings,
            environment=request.environment,
            shrink=Shrink(request.shrink, request.oracle) if request.shrink and request.oracle else None,
            sanitize=request.sanitize,
        )

    def child_env(
        self, work: Path, device: int | None, environment: str, cached: bool, sanitize: bool = False
    ) -> dict[str, str]:
        """What a judging child's environment adds to the scrubbed one (on the node it runs on): the
        toolchain's settings, then the user's threading variables (theirs win, as in a plain run),
        then what `environment` changes (`environments.py`); with `sanitize`, the toolchain's switch
        that builds and serves its kernels sanitized."""
        plan = self.plan
        sanitized = {plan.sanitize_env: "1"} if sanitize and plan.sanitize_env else {}
        users = {**plan.toolchain_env, **environments.settings(environment)}
        env = {
            **plan.toolchain_env,
            hosting.USER_ENV: hosting.user_environment(users),  # what its kernel servers get
            hosting.JAIL_ENV: "1" if sandbox.bubblewrap()[0] else "0",
            "KOPE_BUILD_DIR": str(work / "builds"),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            **(visible_devices_env(plan.device_env_var, device) if device is not None else {}),
            **environments.settings(environment),
            hosting.ENV: "1",  # its kernels run in kernel servers, never in the child itself
            hosting.CALL_TIMEOUT_ENV: str(plan.limits.wall_s),
            tools.JAIL_ENV: "1" if sandbox.bubblewrap()[0] else "0",  # a build step's compiler, jailed
            **sanitized,
        }
        if cached and self.cache is not None:
            env.update(self.cache.env())
        return env

    def _jit_cache(self, candidate: Candidate) -> Path | None:
        """The candidate's own JIT cache for this run, shared by its children so that each kernel
        compiles once (a Triton child spent most of its time compiling what the last one had), and
        writable by no other candidate's child. None: no JIT, or the verification (compiles afresh)."""
        if not self.plan.jit_cache_env or self.private:
            return None
        if self.jit_root is None:
            self.jit_root = Path(tempfile.mkdtemp(prefix=f"kope-jit-{self.plan.operator.name}-"))
        path = self.jit_root / candidate.hash
        path.mkdir(exist_ok=True)
        return path

    def run_fresh(
        self,
        spec: JudgeRequest,
        env: dict[str, str],
        key: bytes,
        work: Path,
        record: Path | None,
        jit: Path | None = None,
    ) -> sandbox.Finished:
        """A new `python -m pytest` child in its own jail (`record` and `jit` writable too); the key
        reaches it through a pipe."""
        plan = self.plan
        key_r, key_w = os.pipe()
        os.write(key_w, key)
        os.close(key_w)
        (work / "spec.json").write_text(json.dumps(replace(spec, key_fd=key_r).to_json()))
        # Only pytest-kope, the repo's conftests and the plugins named in `kope_plugins` load in a
        # judging child: entry-point plugins cost seconds per child (hypothesis alone ~1 s).
        plugins = [a for name in ("pytest_kope.plugin", *plan.plugins) for a in ("-p", name)]
        cmd = [sys.executable, "-m", "pytest", *plugins, "-p", "pytest_kope.judge.child.plugin"]
        cmd += ["--kope-child", str(work / "spec.json"), "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
        cmd += ["--rootdir", str(plan.rootdir), "--kope-seed", str(spec.seed)]
        cmd += [*(["-c", str(plan.inifile)] if plan.inifile else []), *map(str, plan.files)]
        try:
            writable = [p for p in (record, jit) if p is not None]
            place = sandbox.Placement(writable, (key_r,), host=True)
            scrubbed = sandbox.scrubbed_environment(env, work)
            started = sandbox.start(cmd, work, scrubbed, plan.limits, plan.children, place)
            return sandbox.wait(started, plan.limits.wall_s)
        finally:
            os.close(key_r)

    def _build(self, server: ForkServer, candidate: Candidate) -> Judged | float:
        """Build `candidate` into the cache once (a build step); its failure as a verdict, else the
        seconds this call spent building (0 when it was built before)."""
        cache = self.cache
        assert cache is not None  # made with the pool the server came from
        with cache.lock(candidate.hash):
            if candidate.hash in cache.keys:
                return 0.0
            if candidate.hash in cache.failures:
                failure = cache.failures[candidate.hash]
                return _build_failed(candidate, failure.kind, failure.message, 0.0)
            work = server.work()
            try:
                key = secrets.token_bytes(32)
                results = str(work / "results.jsonl")
                spec = JudgeRequest(
                    candidate, self.plan.operator, results, settings=self.plan.settings
                ).to_json()
                env = self.child_env(work, None, environments.USER, cached=False)
                finished, reply = server.run("build", work, spec, env, key)
                cache.builds += 1
                events, _ = read_events(work / "results.jsonl", key)
                failed = [e for e in events if e["event"] == "build_failed"]
                if failed:
                    cache.fail(candidate.hash, failed[0]["kind"], failed[0]["message"])
                    return _build_failed(candidate, failed[0]["kind"], failed[0]["message"], finished.wall_s)
                if reply.get("refused"):
                    message = "screening: " + "; ".join(reply["refused"])
                    cache.fail(candidate.hash, "rejected", message)
                    return _build_failed(candidate, "rejected", message, finished.wall_s)
                if finished.timed_out:  # the judging child would only wait as long again
                    why = f"build: no result after {finished.wall_s:.0f} s (wall-clock limit); killed"
                    return Judged(candidate, Outcome.TIMEOUT, failures=[why], seconds=finished.wall_s)
                built = any(e["event"] == "built" for e in events) and finished.returncode == 0
                if built and reply.get("key"):
                    cache.adopt(candidate.hash, work, reply["key"])
                # otherwise (a crash, a time-out): the judging child builds privately and says why
                return finished.wall_s
            finally:
                shutil.rmtree(work, ignore_errors=True)

    def _keep(self, candidate: Candidate, work: Path, name: str) -> None:
        if self.plan.keep is None:
            return
        keep = self.plan.keep / candidate.short
        keep.mkdir(parents=True, exist_ok=True)
        (keep / Path(candidate.filename).name).write_text(candidate.source)
        files.copy(work / "child.log", keep / name)  # a link there is not followed

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        if self.jit_root is not None:
            shutil.rmtree(self.jit_root, ignore_errors=True)
            self.jit_root = None


def _build_failed(candidate: Candidate, kind: str, message: str, seconds: float) -> Judged:
    outcome = Outcome.REJECTED if kind == "rejected" else Outcome.COMPILE_FAILED
    judged = Judged(candidate, outcome, failures=[message], build_log=message, seconds=seconds)
    judged.phases = {"build": seconds}
    return judged


def _take(recorded: Path, folder: Path) -> None:
    """The committed kernel's recorded calls, moved out of the jail's writable slot into `folder`."""
    if not recorded.is_dir():
        return
    for old in folder.iterdir():
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    for item in recorded.iterdir():
        shutil.move(str(item), folder / item.name)
