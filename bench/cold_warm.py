"""Does the experience graph make the tuner better? Cold (empty graph) against warm, side by side.

1. fill: the tuner optimizes half of the sample operators, filling a graph;
2. cold: the tuner optimizes the other half with an empty graph;
3. warm: the same, same budget, starting from a copy of the filled graph.

For each operator it prints the evaluations each run needed to reach its best, and the evaluations the
warm run needed to come within 5% of the cold run's best (the goal: at most half of cold's). Writes JSON.

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


def to_reach(candidates: list[dict], target: float) -> int | None:
    """1-based evaluation at which the running best speedup first reached `target`."""
    for i, c in enumerate(candidates, 1):
        if (c.get("speedup") or 0) >= target and c["outcome"] in ("better", "ok"):
            return i
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cold_warm.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kope-coldwarm-"))
    repo = work / "ops"
    shutil.copytree(ROOT / "sample_ops", repo, ignore=shutil.ignore_patterns(".kope", "__pycache__"))
    filled, cold_db, warm_db = work / "filled.db", work / "cold.db", work / "warm.db"

    fill = optimize(repo, FILL, filled, args.budget, "fill")
    shutil.copy(filled, warm_db)
    cold = optimize(repo, EVAL, cold_db, args.budget, "cold")
    warm = optimize(repo, EVAL, warm_db, args.budget, "warm")

    rows, results = [], []
    for c, w in zip(cold["operators"], warm["operators"]):
        target = REACHED * (c.get("speedup") or 1.0)
        reach = to_reach(w.get("candidates", []), target)
        cold_reach = to_reach(c.get("candidates", []), target)
        results.append(
            {
                "operator": c["name"],
                "cold_speedup": c.get("speedup"),
                "warm_speedup": w.get("speedup"),
                "cold_evals_to_best": c.get("evaluations_to_best"),
                "warm_evals_to_best": w.get("evaluations_to_best"),
                "cold_evals_to_cold_best": cold_reach,
                "warm_evals_to_cold_best": reach,
            }
        )
        rows.append(
            (
                c["name"],
                f"{c.get('speedup', 0):.2f}x",
                c.get("evaluations_to_best"),
                f"{w.get('speedup', 0):.2f}x",
                w.get("evaluations_to_best"),
                cold_reach,
                reach if reach is not None else "never",
            )
        )
    headers = [
        "operator",
        "cold best",
        "cold evals to best",
        "warm best",
        "warm evals to best",
        "cold evals to ~cold best",
        "warm evals to ~cold best",
    ]
    print(
        f"budget {args.budget} evaluations per operator; filled from {', '.join(FILL)} "
        f"({fill['wall_s']:.0f} s); cold {cold['wall_s']:.0f} s, warm {warm['wall_s']:.0f} s"
    )
    print(tabulate(rows, headers=headers))
    pairs = [
        (r["cold_evals_to_cold_best"], r["warm_evals_to_cold_best"])
        for r in results
        if r["cold_evals_to_cold_best"] and r["warm_evals_to_cold_best"]
    ]
    if pairs:
        ratio = statistics.median(w / c for c, w in pairs)
        print(f"median (warm evals to reach cold's best) / (cold evals): {ratio:.2f}  (goal <= 0.5)")
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
