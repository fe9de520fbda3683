"""Every point of every tuning space passes its operator's correctness tests, on every target.

For each operator of a repo, every valid point of the space its committed source declares is judged
by the project's own judge, as an optimize run judges a tuner's proposal: built once, the correctness
tests with fresh seeds, and the differential check against the committed kernel (recorded calls
replayed as tested, scaled, offset, and with more OpenMP threads). Nothing is timed. Each target adds
compiler flags after every point's own (`KOPE_C_TARGET_FLAGS`): the default target is this machine as
the flag sets select it, `-march=haswell` caps every point at AVX2 (the last `-march` wins over a flag
set's `-march=native`), so a vector width that assumes AVX-512 shows up as a wrong result or a
crash there.

Prints one line per operator and target (points, passed, seconds) and every failing point with its
first failure, writes them as JSON; exits 1 if any point failed. `--max-points` checks a deterministic
subset (the default point first) instead of every point.

    python bench/check_spaces.py                              # bench/unseen_ops, both targets
    python bench/check_spaces.py --repo sample_ops --ops rowsum --target "" --max-points 2
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import plans  # noqa: E402
from bench.tables import chosen_points  # noqa: E402
from pytest_kope.candidate import Candidate  # noqa: E402
from pytest_kope.judge.controller.plan import Plan  # noqa: E402
from pytest_kope.judge.controller.runner import Judge  # noqa: E402
from pytest_kope.toolchains.base import judging_env  # noqa: E402
from pytest_kope.toolchains.c import CToolchain  # noqa: E402

TARGETS = ["", "-march=haswell"]


def check(plan: Plan, target: str, max_points: int) -> tuple[int, list[tuple[dict[str, Any], str]], float]:
    """(points judged, failing points with their first failure, seconds) for one operator and target."""
    tc = CToolchain(target_flags=target or None)
    plan = dataclasses.replace(plan, toolchain_env=judging_env(tc)).with_settings(
        fork_server=True, sequential=True
    )
    op = plan.operator
    points = chosen_points(op.spec.space, max_points)
    judge = Judge(plan, tc.screen)
    started = time.monotonic()
    failed: list[tuple[dict[str, Any], str]] = []
    try:
        base = judge.baseline(op.baseline())
        if not base.outcome.correct:
            return len(points), [(op.spec.space.defaults, "; ".join(base.failures[:2]))], 0.0
        for k in range(0, len(points), plan.jobs):
            batch = [
                Candidate(op.text, op.source.name, op.toolchain, params=p, idea="check", agent="bench")
                for p in points[k : k + plan.jobs]
            ]
            for j in judge.correctness(batch):
                if not j.outcome.correct:
                    failed.append(
                        (j.candidate.params, f"{j.outcome.value}: {(j.failures or ['?'])[0][:300]}")
                    )
                for note in j.notes:
                    print(f"  note {op.name} {j.candidate.params}: {note}")
    finally:
        judge.close()
    return len(points), failed, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "bench" / "unseen_ops")
    parser.add_argument("--ops", default="", help="comma-separated operators (default: all)")
    parser.add_argument(
        "--target", action="append", help='target flags, repeatable (default: "" and "-march=haswell")'
    )
    parser.add_argument("--max-points", type=int, default=1 << 30, help="a deterministic subset beyond this")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "check_spaces.json")
    args = parser.parse_args(argv)
    targets = args.target if args.target is not None else TARGETS
    total = bad = 0
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kope-check-spaces-"):
        with contextlib.redirect_stdout(io.StringIO()):  # the collection's list of tests
            found = plans(args.repo.resolve(), [n for n in args.ops.split(",") if n])
        for plan in found:
            for target in targets:
                n, failed, seconds = check(plan, target, args.max_points)
                rows.append(
                    {
                        "operator": plan.operator.name,
                        "target": target,
                        "points": n,
                        "failed": [{"params": p, "failure": why} for p, why in failed],
                        "seconds": seconds,
                    }
                )
                total, bad = total + n, bad + len(failed)
                label = target or "flag sets as declared"
                print(
                    f"{plan.operator.name:14} {label:24} {n:4} points  {n - len(failed):4} passed  {seconds:6.0f} s",
                    flush=True,
                )
                for params, why in failed:
                    print(f"  FAILED {params}: {why}")
    print(
        f"{len(found)} operators, {len(targets)} targets: {total} points checked, {total - bad} passed, "
        f"{bad} failed, {time.monotonic() - started:.0f} s"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"repo": str(args.repo), "checked": rows}, indent=1, default=str))
    print(f"wrote {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
