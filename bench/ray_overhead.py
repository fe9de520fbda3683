"""What Ray adds: the per-judgement overhead of `--kope-executor ray` against the local executor,
and the wall time of a whole optimize run, local against Ray, on the same operators, seed and budget.

    python bench/ray_overhead.py                       # JSON: bench/results/ray_overhead.json
    python bench/ray_overhead.py --judgements 4 --budget 4 --no-runs

Part 1 judges the same candidates of one sample operator one at a time (correctness, then a paired
timing against the committed kernel) three ways: a child forked from a warm fork server (the local
default), a fresh local child (`--no-kope-fork-server`), and a Ray task on a local cluster started
here (a fresh child on the worker). Per judgement it reports the controller's wall time and, for Ray,
`executor`: the seconds Ray added beyond the child's own run (submit, schedule, ship, send back).

Part 2 runs `pytest sample_ops --kope-optimize -k "rowsum or softmax"` twice on copies of the sample
repo, `--kope-executor local` then `ray` (each starting its own cluster), with `--kope-concurrency 2`,
the same `--kope-seed` and `--kope-budget`, and reports the wall time and the verified winners.
One machine, so this measures overhead, not scale-out: a multi-node cluster was not available.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Ray workers (started by this process) and the optimize runs import this checkout's pytest_kope
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

from bench.overhead import candidates, plans  # noqa: E402
from pytest_kope.judge.controller.plan import Plan  # noqa: E402
from pytest_kope.judge.controller.ray_executor import RayExecutor  # noqa: E402
from pytest_kope.judge.controller.runner import Judge  # noqa: E402
from pytest_kope.toolchains.c import CToolchain  # noqa: E402

MODES = ("fork server", "fresh local", "ray")


def _repo(into: Path) -> Path:
    repo = into / "sample_ops"
    shutil.copytree(ROOT / "sample_ops", repo, ignore=shutil.ignore_patterns(".kope", "__pycache__"))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "ops"]):
        subprocess.run(["git", "-c", "user.name=b", "-c", "user.email=b@b", *args], cwd=repo, check=True)
    return repo


def judge_each(plan: Plan, attempts: list[Any]) -> list[dict[str, float]]:
    """Judge `attempts` one at a time: correctness, then (if correct) a paired timing."""
    judge = Judge(plan, CToolchain().screen)
    rows = []
    try:
        baseline = judge.baseline(plan.operator.baseline())
        assert baseline.outcome.correct, baseline.failures
        for candidate in attempts:
            began = time.monotonic()
            (j,) = judge.correctness([candidate])
            correctness_s = time.monotonic() - began
            row = {"correctness_s": correctness_s, "executor_s": j.phases.get("executor", 0.0)}
            if j.outcome.correct:
                began = time.monotonic()
                judge.performance(j, baseline.candidate)
                row["timing_s"] = time.monotonic() - began
                row["executor_timing_s"] = j.phases.get("executor", 0.0) - row["executor_s"]
            rows.append(row)
    finally:
        judge.close()
    return rows


def per_judgement(op: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp))
        (plan,) = plans(repo, [op])
        plan = dataclasses.replace(plan, jobs=1).with_settings(seeds=2)
        attempts = candidates(plan, n, seed=1)
        results = {
            "fork server": judge_each(plan.with_settings(fork_server=True), attempts),
            "fresh local": judge_each(plan.with_settings(fork_server=False), attempts),
        }
        began = time.monotonic()
        ray = RayExecutor(repo, ship=True)
        start_s = time.monotonic() - began
        try:
            results["ray"] = judge_each(dataclasses.replace(plan, executor=ray), attempts)
        finally:
            ray.close()
    return {"operator": op, "judgements": n, "ray_start_s": start_s, "rows": results}


def optimize_run(executor: str, budget: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repo(Path(tmp))
        env = dict(os.environ)
        env.pop("RAY_ADDRESS", None)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--kope-optimize",
            "-k",
            "rowsum or softmax",
        ]
        cmd += ["--kope-executor", executor, "--kope-concurrency", "2", "--kope-budget", str(budget)]
        cmd += ["--kope-seed", str(seed), "--kope-agent", "tuner"]
        began = time.monotonic()
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
        wall = time.monotonic() - began
        reports = sorted((repo / ".kope" / "runs").glob("*/report.json"))
        if proc.returncode != 0 or not reports:
            raise SystemExit(f"{executor} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
        report = json.loads(reports[-1].read_text())
    return {
        "executor": executor,
        "wall_s": wall,
        "operators": {
            o["name"]: {"verified": o["verified"], "best": o["best"]["id"][:8], "speedup": o["speedup"]}
            for o in report["operators"]
        },
    }


def _median(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", default="rowsum")
    parser.add_argument("--judgements", type=int, default=6)
    parser.add_argument("--budget", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-runs", action="store_true", help="only the per-judgement part")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "ray_overhead.json")
    args = parser.parse_args(argv)

    part1 = per_judgement(args.op, args.judgements)
    rows = part1["rows"]
    table = [
        [
            mode,
            len(rows[mode]),
            _median(rows[mode], "correctness_s"),
            _median(rows[mode], "timing_s"),
            _median(rows[mode], "executor_s") if mode == "ray" else "",
            _median(rows[mode], "executor_timing_s") if mode == "ray" else "",
        ]
        for mode in MODES
    ]
    print(
        f"per judgement, {args.op}, one at a time (median seconds); Ray cluster start {part1['ray_start_s']:.1f} s"
    )
    print(
        tabulate(
            table,
            ["mode", "n", "correctness", "timing", "ray adds (correctness)", "ray adds (timing)"],
            floatfmt=".2f",
        )
    )
    part1["summary"] = {
        mode: {
            k: _median(rows[mode], k)
            for k in ("correctness_s", "timing_s", "executor_s", "executor_timing_s")
        }
        for mode in MODES
    }

    runs = []
    if not args.no_runs:
        runs = [optimize_run(e, args.budget, args.seed) for e in ("local", "ray")]
        print(f"\noptimize rowsum and softmax, --kope-concurrency 2, budget {args.budget}, seed {args.seed}")
        print(
            tabulate(
                [
                    [
                        r["executor"],
                        r["wall_s"],
                        *(
                            f"{o['best']} {o['speedup'] or 0:.2f}x {'verified' if o['verified'] else ''}"
                            for o in r["operators"].values()
                        ),
                    ]
                    for r in runs
                ],
                ["executor", "wall s", *runs[0]["operators"]],
                floatfmt=".1f",
            )
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"per_judgement": part1, "runs": runs}, indent=1, default=str))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
