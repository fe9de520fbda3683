"""The plugin a judging child loads (`-p pytest_kope.judge.child --kope-child SPEC.json`).

It parametrizes the operator's tests over the candidate (and the seeds), keeps only the tests the
controller selected, sets the reference kernel for paired timing, and streams results as JSON lines
so that a crash mid-run still leaves what happened before it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ..candidate import Candidate
from ..operator import Operator, operator_of

_OURS = re.compile(r"-?kope-(?:[0-9a-f]{8}|seed\d+)")


def base_nodeid(nodeid: str) -> str:
    """The controller's id of a test: the child's id without the candidate and seed parameters."""
    stripped = _OURS.sub("", nodeid).replace("[-", "[")
    return stripped.replace("[]", "")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--kope-child", dest="kope_child", help="(internal) judging spec for a child process")


class Child:
    def __init__(self, config: pytest.Config, spec: dict[str, Any]):
        self.config = config
        self.candidate = Candidate.from_json(spec["candidate"])
        self.reference = Candidate.from_json(spec["reference"]) if spec.get("reference") else None
        self.selected = set(spec["tests"])
        self.seeds = spec.get("seeds") or []
        self.operator = spec["operator"]
        self.out = open(spec["results"], "a", buffering=1)  # noqa: SIM115 - line-buffered for the whole session
        self.kinds: dict[str, str] = {}
        self.key = read_key(spec.get("key_fd"))

    def emit(self, **event: Any) -> None:
        self.out.write(sign(self.key, json.dumps(event, default=str)) + "\n")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "kope_candidate" in metafunc.fixturenames:
            metafunc.parametrize(
                "kope_candidate", [self.candidate], ids=[f"kope-{self.candidate.short}"], indirect=True
            )
        if self.seeds and "kope_seed" in metafunc.fixturenames:
            metafunc.parametrize(
                "kope_seed", self.seeds, ids=[f"kope-seed{s}" for s in self.seeds], indirect=True
            )

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep = [i for i in items if base_nodeid(i.nodeid) in self.selected and operator_of(i) is not None]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
        self.emit(event="collected", count=len(keep))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.reference is None:
            return
        from ..plugin import _bench_session
        from .building import build_cached
        from .timing import last_level_cache_bytes

        bench = _bench_session(self.config)
        op = Operator(**{**self.operator, "source": Path(self.operator["source"])})
        bench.reference = build_cached(self.config, op, self.reference)
        # Reads can stream faster than a copy and DRAM flips between regimes ~1.6x apart: 3x a measured
        # copy is a bound no honest kernel reaches, and one a result read from nowhere exceeds easily.
        bench.max_bytes_per_s = _copy_bandwidth(4 * last_level_cache_bytes()) * 3.0

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.emit(event="start", test=base_nodeid(nodeid))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Any:
        report = yield
        if call.excinfo is not None:
            self.kinds[item.nodeid] = call.excinfo.typename
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and report.passed:
            return
        message = ""
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
        self.emit(
            event="report",
            test=base_nodeid(report.nodeid),
            when=report.when,
            outcome=report.outcome,
            message=message[:4000],
            kind=self.kinds.get(report.nodeid, ""),
            seconds=report.duration,
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from ..plugin import BENCH

        bench = self.config.stash.get(BENCH, None)
        for record in bench.paired if bench else []:
            self.emit(
                event="timing",
                suspect=record.suspect,
                **{**record.timing.__dict__, "test": base_nodeid(record.timing.test)},
            )
        self.emit(event="done")
        self.out.close()


def read_key(fd: int | None) -> bytes:
    """The controller's signing key, from a pipe drained and closed before any candidate code is loaded:
    a kernel (native code in this process) can write lines into results.jsonl, but cannot sign them."""
    if fd is None:
        return b""
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def sign(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest() + " " + payload


def verify(key: bytes, line: str) -> str | None:
    """The payload of a line `sign` wrote with `key`, else None."""
    mac, _, payload = line.partition(" ")
    good = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
    return payload if hmac.compare_digest(mac, good) else None


def _copy_bandwidth(nbytes: int) -> float:
    """Bytes per second moved by numpy copying a buffer larger than the cache (read + write)."""
    import time

    import numpy as np

    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("kope_child")
    if path:
        from . import guards

        guards.PROBE = True  # results must follow the data, not the buffers' addresses
        config.pluginmanager.register(Child(config, json.loads(Path(path).read_text())), "kope-child")
