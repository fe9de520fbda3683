"""Make toolchains through the hook and build candidates once per process (the fixture's back end)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from ..candidate import Candidate
from ..errors import BuildError, KopeError, LibraryRejected, ToolchainMissing
from ..operator import Operator
from ..paths import kope_dir
from ..spec import parse_spec
from ..toolchains.base import Kernel, Toolchain

_TOOLCHAINS = pytest.StashKey[dict]()
# candidate hash -> (outcome kind, message) of a failed build, for the judging child's typed events
FAILED_BUILDS: dict[str, tuple[str, str]] = {}


def toolchain_of(config: pytest.Config, name: str) -> Toolchain:
    made = config.stash.setdefault(_TOOLCHAINS, {})
    if name not in made:
        tc = config.hook.pytest_kope_make_toolchain(name=name, config=config)
        if tc is None:
            known = sorted(
                {n for names in config.hook.pytest_kope_toolchain_names(config=config) for n in names}
            )
            raise ToolchainMissing(f"no toolchain named {name!r} (known: {', '.join(known)})")
        made[name] = tc
    return made[name]


def build_cached(config: pytest.Config, op: Operator, candidate: Candidate) -> Kernel:
    """Build once per process; a failure becomes a test error naming the operator and the file."""
    from ..settings import BUILT

    built = config.stash[BUILT]
    if candidate.hash in built:
        kernel = built[candidate.hash]
        if isinstance(kernel, Exception):
            pytest.fail(str(kernel), pytrace=False)
        return kernel
    try:
        tc = toolchain_of(config, candidate.toolchain)
        available = tc.availability()
        if not available.ok:
            pytest.skip(f"kope: toolchain {tc.name} unavailable: {available.reason}")
        spec, own = op.spec, parse_spec(candidate.source, candidate.filename)
        # The interface (prototypes, which arguments are in-place) is the oracle's, from the committed
        # source: a candidate that re-declared `x` as non-const or in-place would switch off the input
        # guard for it. The candidate keeps its own tuning space.
        interface = op.build_context(replace(own, kernels=spec.kernels or own.kernels, inplace=spec.inplace))
        builds = (
            Path(os.environ["KOPE_BUILD_DIR"])
            if os.environ.get("KOPE_BUILD_DIR")
            else kope_dir(config) / "builds"
        )
        kernel = tc.build(candidate, interface, builds)
    except KopeError as e:  # a build error or a bad header: remembered, so every test of it fails alike
        if isinstance(e, BuildError):
            where = (
                op.source
                if candidate.agent == "baseline"
                else f"{candidate.filename} (candidate {candidate.short})"
            )
            message = f"kope: operator {op.name}: build of {where} failed:\n{e.log.rstrip()}"
            kind = "rejected" if isinstance(e, LibraryRejected) else "compile_failed"
        else:
            message = f"kope: operator {op.name} ({op.source}): {e}"
            kind = "compile_failed"
        FAILED_BUILDS[candidate.hash] = (kind, message)
        built[candidate.hash] = KopeError(message)
        pytest.fail(message, pytrace=False)
    built[candidate.hash] = kernel
    return kernel
