"""The environments a candidate's correctness is judged in, so that no setting separates "judged" from
"used": the user's own (what a plain `pytest` of theirs sees) and oversubscribed (where races show).

A kernel can read its environment (the thread count, a variable); one that is right only in the
judge's would pass a judge that decides in one environment and be wrong where it is used. So every
correctness test runs in each environment, on fresh seeds of its own, and a failure in either fails
the candidate. Timing children and the plain `pytest` check of a winner run in the user's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

USER = "user"  # the user's threading variables as they are; none set: the runtime's defaults
OVERSUBSCRIBED = "oversubscribed"  # the user's, with more OpenMP threads than cores
ENVIRONMENTS = (USER, OVERSUBSCRIBED)

# Variables that steer the threading runtimes a kernel links (OpenMP, BLAS, TBB): a plain run sees the
# user's values, so every child does, as they are.
THREADING = re.compile(r"(OMP|GOMP|KMP|MKL|OPENBLAS|GOTO|BLIS|NUMEXPR|VECLIB|TBB)_[A-Z0-9_]+")


def users(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The user's threading variables (this process's: the plugin's own defaults included, as a plain
    run sets them, e.g. OMP_WAIT_POLICY=passive)."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if THREADING.fullmatch(k)}


def settings(environment: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a child judged in `environment` sets on top of the scrubbed environment."""
    env = users(environ)
    if environment == OVERSUBSCRIBED:
        env["OMP_NUM_THREADS"] = str(oversubscribed_threads(env))
    return env


def oversubscribed_threads(env: Mapping[str, str]) -> int:
    """Four threads a core, or the user's own count when it is higher already."""
    cores = max(1, len(os.sched_getaffinity(0)))
    try:
        theirs = max(int(n) for n in env.get("OMP_NUM_THREADS", "").split(","))
    except ValueError:
        theirs = 0
    return max(4 * cores, theirs)


def describe(environment: str, environ: Mapping[str, str] | None = None) -> str:
    """The environment in a few words, for a failure that happened only there."""
    threads = settings(environment, environ).get("OMP_NUM_THREADS", "unset")
    return f"{environment} environment (OMP_NUM_THREADS={threads})"


def share(seeds: list[int]) -> list[tuple[str, list[int]]]:
    """Each environment with its own seeds (round robin over `seeds`): every environment runs every
    correctness test, and the seeds' fresh inputs are spread over them. Needs at least one seed each."""
    assert len(seeds) >= len(ENVIRONMENTS), "one seed per environment at least"
    return [(env, seeds[i :: len(ENVIRONMENTS)]) for i, env in enumerate(ENVIRONMENTS)]
