"""Full timing tables of the sample operators' tuning spaces, for replaying searches without noise.

For each operator, every valid point of the space its committed source declares (or a deterministic
subset of `--max-points`, the default point always in it) is judged once with the project's own
judge: the correctness tests, then a paired timing against the committed kernel. A table is JSON:

    {"operator", "family", "source_hash", "space_hash", "hardware", "axes", "requires",
     "points": [{"params": {...}, "outcome": "ok", "ratio": 3.1, "ratio_low": 2.9, "seconds": 0.004}]}

`ratio` is the committed kernel's time over the point's (> 1 is faster), pooled: the committed
kernel's time is the median over the points of each one's paired ratio x its own seconds, and a
point's ratio is that over its `seconds`, the median of all its timings (`times`; `ratios` and
`measured_ratio` keep what the pairings said). It is the figure `Table.from_json` loads back, unchanged.
A table is reused while the source and hardware are the same: a changed source (a new space) makes it
stale, and this command measures it again; points already measured for the same source are kept (an
interrupted run resumes).

The fastest `--refine` points are then timed `--again` more times; their `seconds` become the median
of all their timings, and their ratio the pooled one of that median.

    python bench/tables.py [--ops softmax,sgemm] [--max-points 150] [--refine 6] [--out bench/tables]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overhead import plans  # noqa: E402
from pytest_kope.agents.tuner.search import pooled  # noqa: E402
from pytest_kope.candidate import Candidate  # noqa: E402
from pytest_kope.judge.controller.plan import Plan  # noqa: E402
from pytest_kope.judge.controller.runner import Judge  # noqa: E402
from pytest_kope.spec import _LINE, TuningSpace  # noqa: E402
from pytest_kope.toolchains.c import CToolchain  # noqa: E402

TABLES = ROOT / "bench" / "tables"


def space_hash(space: TuningSpace) -> str:
    text = json.dumps({"axes": {k: list(v) for k, v in space.axes.items()}, "requires": list(space.requires)})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def key(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, default=str)


def chosen_points(space: TuningSpace, max_points: int, seed: int = 0) -> list[dict[str, Any]]:
    """All valid points, or a deterministic subset of `max_points` with the default first."""
    points = list(space.points())
    if len(points) <= max_points:
        return points
    rest = [p for p in points if p != space.defaults]
    random.Random(seed).shuffle(rest)
    return [space.defaults, *rest[: max_points - 1]]


def header(text: str) -> str:
    """The source's `kope:` lines: its kernels and tuning space, all a table replay needs."""
    return "\n".join(line for line in text.splitlines() if _LINE.match(line)) + "\n"


def load(path: Path, plan: Plan, hardware: dict[str, Any]) -> dict[str, Any] | None:
    """The cached table when it was measured from this source on this hardware, else None."""
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    same = table.get("source_hash") == source_hash(plan.operator.text) and table.get(
        "hardware_key"
    ) == hw_key(hardware)
    return table if same else None


def save(path: Path, table: dict[str, Any]) -> None:
    """Write the table settled: each point's seconds the median of all its timings, its ratio pooled
    (`pooled`, as `Table.from_json` computes it), so what is stored is what a replay searches."""
    for row in table["points"]:
        if row.get("times"):
            row["seconds"] = statistics.median(row["times"])
            row["measured_ratio"] = statistics.median(row["ratios"])
    pooled({str(i): row for i, row in enumerate(table["points"])})
    path.write_text(json.dumps(table, indent=1, default=str))


def hw_key(hardware: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(hardware, sort_keys=True, default=str).encode()).hexdigest()[:16]


def measure(plan: Plan, out: Path, max_points: int, deadline: float) -> dict[str, Any]:
    tc = CToolchain()
    hardware = tc.fingerprint()
    op = plan.operator
    space = op.spec.space
    path = out / f"{op.name}.json"
    table = load(path, plan, hardware) or {
        "operator": op.name,
        "family": op.family,
        "source_hash": source_hash(op.text),
        "space_hash": space_hash(space),
        "hardware": hardware,
        "hardware_key": hw_key(hardware),
        "axes": {k: list(v) for k, v in space.axes.items()},
        "requires": list(space.requires),
        "space_size": len(list(space.points())),
        "subset": None,
        "measured_with": "pytest_kope.judge Judge: correctness tests, then paired timing vs the committed kernel",
        "points": [],
    }
    table["header"] = header(op.text)
    wanted = chosen_points(space, max_points)
    table["subset"] = None if len(wanted) == table["space_size"] else f"{len(wanted)} points, seed 0"
    done = {key(p["params"]) for p in table["points"]}
    todo = [p for p in wanted if key(p) not in done]
    if not todo:
        save(path, table)
        return table
    plan = plan.with_settings(fork_server=True, sequential=True)
    judge = Judge(plan, tc.screen)
    started = time.monotonic()
    try:
        base = judge.baseline(op.baseline())
        if not base.outcome.correct:
            raise SystemExit(f"{op.name}: the committed kernel fails its tests: {base.failures[:2]}")
        for k in range(0, len(todo), plan.jobs):
            if time.monotonic() > deadline:
                print(f"{op.name}: deadline reached, {len(table['points'])} points kept (rerun to resume)")
                break
            batch = [
                Candidate(op.text, op.source.name, op.toolchain, params=p, idea="table", agent="bench")
                for p in todo[k : k + plan.jobs]
            ]
            for j in judge.correctness(batch):
                if j.outcome.correct:
                    judge.performance(j, base.candidate)
                row: dict[str, Any] = {"params": j.candidate.params, "outcome": j.outcome.value}
                if j.outcome.correct and j.timings:
                    row.update(ratio=j.ratio, ratio_low=j.ratio_low, seconds=j.time_s)
                    row.update(ratios=[j.ratio], times=[j.time_s])
                elif j.failures:
                    row["failure"] = j.failures[0][:200]
                table["points"].append(row)
            save(path, table)
    finally:
        judge.close()
    print(f"{op.name}: {len(table['points'])} points in {time.monotonic() - started:.0f} s")
    return table


def refine(plan: Plan, out: Path, top: int, again: int) -> None:
    """Time the table's `top` fastest points `again` more times each; each keeps the median of all its
    timings: one timing of a memory-bound kernel can land in the fast DRAM regime and make a lone,
    false best."""
    tc = CToolchain()
    op = plan.operator
    path = out / f"{op.name}.json"
    table = load(path, plan, tc.fingerprint())
    if table is None:
        return
    ranked = sorted((p for p in table["points"] if p.get("ratio")), key=lambda p: -p["ratio"])
    for row in ranked[:top]:  # a row of an older table: its later ratios came without their times
        if len(row.get("times", [])) != len(row.get("ratios", [])) or not row.get("times"):
            first = row.get("ratios", [row.get("measured_ratio", row["ratio"])])[0]
            row["ratios"], row["times"] = [first], [row["seconds"]]
    todo = [p for p in ranked[:top] if len(p["times"]) < 1 + again]
    if not todo:
        return
    plan = plan.with_settings(fork_server=True, sequential=True)
    judge = Judge(plan, tc.screen)
    try:
        base = judge.baseline(op.baseline())
        for row in todo:
            cand = Candidate(
                op.text, op.source.name, op.toolchain, params=row["params"], idea="table", agent="bench"
            )
            (j,) = judge.correctness([cand])
            for _ in range(1 + again - len(row["times"])):
                if j.outcome.correct:
                    judge.performance(j, base.candidate)
                    if j.ratio and j.time_s:
                        row["ratios"].append(j.ratio)
                        row["times"].append(j.time_s)
            save(path, table)
    finally:
        judge.close()
    print(f"{op.name}: top {len(todo)} points timed {again} more times (median of all timings kept)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "sample_ops")
    parser.add_argument("--ops", default="", help="comma-separated operators (default: all)")
    parser.add_argument("--max-points", type=int, default=150, help="a deterministic subset beyond this")
    parser.add_argument("--minutes", type=float, default=30.0, help="stop measuring after this (resumable)")
    parser.add_argument("--out", type=Path, default=TABLES)
    parser.add_argument("--refine", type=int, default=6, help="re-time this many of the fastest points")
    parser.add_argument("--again", type=int, default=2, help="extra timings of each refined point")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * args.minutes
    with tempfile.TemporaryDirectory(prefix="kope-tables-"):
        for plan in plans(args.repo.resolve(), [n for n in args.ops.split(",") if n]):
            table = measure(plan, args.out, args.max_points, deadline)
            if args.refine and time.monotonic() < deadline:
                refine(plan, args.out, args.refine, args.again)
                table = json.loads((args.out / f"{plan.operator.name}.json").read_text())
            ok = [p for p in table["points"] if p.get("ratio")]
            best = max((p["ratio"] for p in ok), default=0.0)
            print(
                f"{table['operator']:10} {len(table['points'])}/{table['space_size']} points, best {best:.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
