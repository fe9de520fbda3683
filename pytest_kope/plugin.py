"""The pytest plugin: options, the `kope` marker and the fixtures. Thin: everything else is delegated.

Without `--kope-optimize` it only serves fixtures to tests that ask for them, so plain runs cost nothing.
"""

from __future__ import annotations

import os
import random
import zlib
from typing import TYPE_CHECKING, Any

import pytest

from .errors import MarkerError
from .judge.child.benchstash import BENCH, bench_session
from .operator import MARKER, base_nodeid, is_performance_test, operator_of
from .session.border import border, failing
from .settings import BUILT, SEED

if TYPE_CHECKING:
    from .candidate import Candidate
    from .judge.child.bench import Bench
    from .judge.child.guards import GuardedKernel
    from .operator import Operator


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Add pytest-kope's hookspecs."""
    from . import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The --kope-* options and kope_* ini values (`options.py`)."""
    from .options import add_options

    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Markers, the built-in toolchains and agents, the seed; the session under --kope-optimize."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(name, source, family=None, toolchain=None, rtol=None, flops=None): the operator this module's tests judge and its "
        "kernel source (relative to the test file)",
    )
    config.addinivalue_line("markers", "kope_perf: a performance test of a kope operator (set automatically)")
    from . import agents, toolchains

    config.pluginmanager.register(toolchains, "kope-toolchains")
    config.pluginmanager.register(agents, "kope-agents")
    seed = config.getoption("kope_seed")
    config.stash[SEED] = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    config.stash[BUILT] = {}
    wanted = config.getoption("kope_optimize") or config.getoption("kope_check")
    if wanted and not hasattr(config, "workerinput"):
        from .session.session import KopeSession

        config.pluginmanager.register(KopeSession(config), "kope-session")


def pytest_report_header(config: pytest.Config) -> str:
    """The run's seed, and how to replay it."""
    return f"kope: rng seed {config.stash[SEED]} (replay with --kope-seed {config.stash[SEED]})"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the performance tests of kope operators `kope_perf`."""
    with border():
        for item in items:
            if is_performance_test(item) and operator_of(item) is not None:
                item.add_marker(pytest.mark.kope_perf)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    """One line when operators run on plain `triton` where triton-ascend is installed."""
    from .toolchains.selection import notice

    with border():
        return notice((op.name, op.toolchain) for item in items if (op := operator_of(item)) is not None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failing operator test says which operator and which kernel file it judged."""
    from .candidate import Candidate

    report = yield
    if report.failed and hasattr(report.longrepr, "addsection"):
        op = operator_of(item)
        if op is not None:
            candidate = item.funcargs.get("kope_candidate") if hasattr(item, "funcargs") else None
            which = (
                f" (candidate {candidate.short}, {candidate.params})"
                if isinstance(candidate, Candidate) and candidate.agent != "baseline"
                else ""
            )
            report.longrepr.addsection("kope", f"operator {op.name!r} failed with kernel {op.source}{which}")
    return report


@pytest.fixture
def kope_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this test's random inputs (a judging child parametrizes it over several seeds)."""
    return int(getattr(request, "param", request.config.stash[SEED]))


@pytest.fixture
def rng(request: pytest.FixtureRequest, kope_seed: int) -> Any:
    """A numpy Generator, fresh every run (the seed is in the header), distinct for every test."""
    import numpy as np

    return np.random.default_rng([kope_seed, zlib.crc32(base_nodeid(request.node.nodeid).encode())])


@pytest.fixture
def kope_operator(request: pytest.FixtureRequest) -> Operator:
    """The operator named by the module's `pytest.mark.kope(...)`."""
    with border():
        op = operator_of(request.node)
        if op is None:
            raise MarkerError(
                f'{request.node.nodeid} uses the kernel fixture but has no pytest.mark.kope("name", source="file")'
            )
    return op


@pytest.fixture
def kope_candidate(request: pytest.FixtureRequest, kope_operator: Operator) -> Candidate:
    """The candidate under test: the committed kernel, or the one a judging child was given."""
    return getattr(request, "param", None) or kope_operator.baseline()


@pytest.fixture
def kernel(
    request: pytest.FixtureRequest, kope_operator: Operator, kope_candidate: Candidate
) -> GuardedKernel:
    """The operator's kernel, built by its toolchain; calls are checked by the oracle guards."""
    from .judge.child import perfinputs, state
    from .judge.child.building import build_cached
    from .judge.child.guards import GuardedKernel

    run = state.of(request.config)
    if run.recording is not None:  # a fork server recording a perf test's inputs: no code
        return perfinputs.StandInKernel()  # type: ignore[return-value]
    with failing():
        return GuardedKernel(build_cached(request.config, kope_operator, kope_candidate), run=run)


@pytest.fixture
def kope_bench(request: pytest.FixtureRequest, kernel: GuardedKernel) -> Bench:
    """Time a kernel call: `kope_bench(kernel.softmax, x, y, rows, cols)`; marks the test as a performance test."""
    from .judge.child import perfinputs, state
    from .judge.child.bench import Bench
    from .toolchains import toolchain_of

    recording = state.of(request.config).recording
    if recording is not None:  # a fork server recording a perf test's inputs
        return perfinputs.RecordingBench(recording)  # type: ignore[return-value]
    timer = toolchain_of(request.config, kernel.kernel.candidate.toolchain).timer()
    return Bench(request.node.nodeid, timer, bench_session(request.config), pytest.skip)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The kernel timings of a plain run."""
    session = config.stash.get(BENCH, None)
    if session is None or not session.plain:
        return
    from .review.report import bench_table

    terminalreporter.write_sep("-", "kope: kernel timings (median per call)")
    terminalreporter.write_line(bench_table(session.plain))


def pytest_sessionstart(session: pytest.Session) -> None:
    """OpenMP workers wait passively, so timings hold steady on a loaded machine."""
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
