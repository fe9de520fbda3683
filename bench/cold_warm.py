"""Does the experience graph make the tuner better? Cold (empty graph) against warm, side by side.

1. fill: the tuner optimizes half of the sample operators, filling a graph;
2. cold: the tuner optimizes the other half with an empty graph;
3. warm: the same, same budget, starting from a copy of the filled graph.

Cold and warm run each operator on its own, so that no run learns from another operator of its half.

For each operator it prints each run's verified best and the evaluation that found it, and whether warm
came within 5% of cold's best and after how many evaluations (the goal: at most half of cold's).
Writes JSON.

    python bench/cold_warm.py [--budget 16] [--out bench/results/cold_warm.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
FILL = ["softmax", "layernorm", "gelu", "transpose"]
EVAL = ["rmsnorm", "rowsum", "swiglu", "sgemm"]
REACHED = 0.95  # within 5% of the cold best counts as reaching it: paired timing noise is of that order


def optimize(repo: Path, ops: list[str], db: Path, budget: int, label: str) -> dict:
    report = repo / f"{label}.json"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--kope-optimize",
        "--kope-agent",
        "tuner",
        "--kope-budget",
        str(budget),
        "--kope-no-commit",
        "--kope-db",
        str(db),
        "--kope-report",
        str(report),
        *[str(repo / op) for op in ops],
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    if not report.exists():
        sys.exit(
            f"{label} run wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        )
    data = json.loads(report.read_text())
    data["wall_s"] = time.monotonic() - start
    return data


def reach(cold: dict, warm: dict) -> int | None:
    """Evaluations warm needed to match cold's verified best (within 5%), or None if it never did.

    Both bests are verified figures (a fresh paired timing against the baseline). In-loop speedups are
    products of chained paired ratios and grow with every step (winner's curse), so a long cold lineage
    would look better than a one-step warm find; they are not compared here.
    """
    if (warm.get("speedup") or 0.0) >= REACHED * (cold.get("speedup") or 0.0):
        return warm.get("evaluations_to_best")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cold_warm.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kope-coldwarm-"))
    repo = work / "ops"
    shutil.copytree(ROOT / "sample_ops", repo, ignore=shutil.ignore_patterns(".kope", "__pycache__"))
    filled = work / "filled.db"

    fill = optimize(repo, FILL, filled, args.budget, "fill")
    # Each operator alone, so neither run learns from the other half's operators during the run:
    # cold from an empty graph, warm from a fresh copy of the filled one.
    cold_runs, warm_runs = [], []
    for op in EVAL:
        cold_runs.append(optimize(repo, [op], work / f"cold-{op}.db", args.budget, f"cold-{op}"))
        shutil.copy(filled, work / f"warm-{op}.db")
        warm_runs.append(optimize(repo, [op], work / f"warm-{op}.db", args.budget, f"warm-{op}"))
    cold = {
        "operators": [r["operators"][0] for r in cold_runs],
        "wall_s": sum(r["wall_s"] for r in cold_runs),
        "hardware_name": cold_runs[0].get("hardware_name"),
    }
    warm = {
        "operators": [r["operators"][0] for r in warm_runs],
        "wall_s": sum(r["wall_s"] for r in warm_runs),
    }

    rows, results = [], []
    for c, w in zip(cold["operators"], warm["operators"]):
        warm_reach = reach(c, w)
        results.append(
            {
                "operator": c["name"],
                "cold_speedup": c.get("speedup"),
                "warm_speedup": w.get("speedup"),
                "cold_evals_to_best": c.get("evaluations_to_best"),
                "warm_evals_to_best": w.get("evaluations_to_best"),
                "warm_evals_to_cold_best": warm_reach,
            }
        )
        share = (
            f"{warm_reach / c['evaluations_to_best']:.2f}"
            if warm_reach and c.get("evaluations_to_best")
            else "-"
        )
        rows.append(
            (
                c["name"],
                f"{c.get('speedup') or 0:.2f}x",
                c.get("evaluations_to_best"),
                f"{w.get('speedup') or 0:.2f}x",
                w.get("evaluations_to_best"),
                warm_reach if warm_reach is not None else "never",
                share,
            )
        )
    headers = [
        "operator",
        "cold best",
        "cold evals to best",
        "warm best",
        "warm evals to best",
        "warm evals to cold's best",
        "warm/cold",
    ]
    print(
        f"budget {args.budget} evaluations per operator; filled from {', '.join(FILL)} "
        f"({fill['wall_s']:.0f} s); cold {cold['wall_s']:.0f} s, warm {warm['wall_s']:.0f} s"
    )
    print(tabulate(rows, headers=headers))
    shares = [
        r["warm_evals_to_cold_best"] / r["cold_evals_to_best"]
        for r in results
        if r["warm_evals_to_cold_best"] and r["cold_evals_to_best"]
    ]
    missed = sum(r["warm_evals_to_cold_best"] is None for r in results)
    if shares:
        print(
            f"median warm/cold evaluations to cold's best: {statistics.median(shares):.2f} (goal <= 0.5); "
            f"warm never reached cold's best on {missed} of {len(results)}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "budget": args.budget,
                "fill": FILL,
                "eval": EVAL,
                "results": results,
                "hardware": cold.get("hardware_name"),
                "wall_s": {"fill": fill["wall_s"], "cold": cold["wall_s"], "warm": warm["wall_s"]},
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
