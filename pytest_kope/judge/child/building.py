"""Make toolchains through the hook and build candidates once per process (the fixture's back end)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest

from ...candidate import Candidate
from ...errors import BuildError, BuildFailed, KopeError, LibraryRejected
from ...operator import Operator
from ...paths import kope_dir
from ...spec import KernelSpec, parse_spec
from ...toolchains import toolchain_of
from ...toolchains.base import BuildsAhead, Kernel, Toolchain
from ..kernel import hosting
from . import state


def interface_of(op: Operator, candidate: Candidate) -> KernelSpec:
    """What a candidate is built against: the committed interface, the candidate's own tuning space.

    The interface (prototypes, which arguments are in-place) is the oracle's, from the committed
    source: a candidate that re-declared `x` as non-const or in-place would switch off the input guard
    for it. Raises SpecError for a header the grammar refuses.
    """
    spec, own = op.spec, parse_spec(candidate.source, candidate.filename)
    return op.build_context(replace(own, kernels=spec.kernels or own.kernels, inplace=spec.inplace))


def build_failure(op: Operator, candidate: Candidate, e: KopeError) -> tuple[str, str]:
    """(outcome kind, message) of a failed build or a bad header, naming the operator and the file."""
    if isinstance(e, BuildError):
        where = (
            op.source
            if candidate.agent == "baseline"
            else f"{candidate.filename} (candidate {candidate.short})"
        )
        message = f"kope: operator {op.name}: build of {where} failed:\n{e.log.rstrip()}"
        return ("rejected" if isinstance(e, LibraryRejected) else "compile_failed"), message
    return "compile_failed", f"kope: operator {op.name} ({op.source}): {e}"


def build_dir_for(config: pytest.Config, tc: Toolchain, candidate: Candidate, interface: KernelSpec) -> Path:
    """The run's read-only build cache (`KOPE_BUILD_CACHE`) when it holds this candidate, else
    `KOPE_BUILD_DIR`, else `.kope/builds`: a judging child builds only what the cache lacks, privately."""
    cache = os.environ.get("KOPE_BUILD_CACHE")
    if cache and isinstance(tc, BuildsAhead) and (Path(cache) / tc.build_key(candidate, interface)).is_dir():
        return Path(cache)
    if os.environ.get("KOPE_BUILD_DIR"):
        return Path(os.environ["KOPE_BUILD_DIR"])
    return kope_dir(config) / "builds"


def build_cached(config: pytest.Config, op: Operator, candidate: Candidate) -> Kernel:
    """Build once per process; a failure raises BuildFailed naming the operator and the file (the
    `kernel` fixture's border makes it the test's failure)."""
    from ...settings import BUILT

    built, run = config.stash[BUILT], state.of(config)
    if candidate.hash in built:
        kernel = built[candidate.hash]
        if isinstance(kernel, Exception):
            raise BuildFailed(str(kernel))
        return cast(Kernel, kernel)
    started = time.monotonic()
    try:
        tc = toolchain_of(config, candidate.toolchain)
        available = tc.availability()
        if not available.ok:
            pytest.skip(f"kope: toolchain {tc.name} unavailable: {available.reason}")
        interface = interface_of(op, candidate)
        build_dir = build_dir_for(config, tc, candidate, interface)
        if hosting.wanted():  # a judging process: the kernel is served by a process of its own
            kernel = hosting.serve(tc, candidate, interface, build_dir)
        else:
            kernel = tc.build(candidate, interface, build_dir)
    except KopeError as e:  # a build error or a bad header: remembered, so every test of it fails alike
        kind, message = build_failure(op, candidate, e)
        run.failed_builds[candidate.hash] = (kind, message)  # for the judging child's typed events
        built[candidate.hash] = KopeError(message)
        raise BuildFailed(message) from None
    finally:
        run.build_seconds.append(time.monotonic() - started)
    built[candidate.hash] = kernel
    return kernel
