"""Does the experience graph make the tuner better? Cold (empty graph) against warm, side by side.

1. fill: the tuner optimizes some operators (of one repo), filling a graph;
2. cold: the tuner optimizes other operators (of the same repo or another) with an empty graph;
3. warm: the same, same budget, starting from a copy of the filled graph.

Cold and warm run each operator on its own, so that no run learns from another evaluated operator.

For each operator it prints each run's verified best and the evaluation that found it, warm's winner
against cold's head to head, and at which evaluation each run first held a point at cold's winner's
level (within 5% or within noise, paired in one child; the goal: warm in at most half of cold's).
Writes JSON.

    python bench/cold_warm.py [--budget 16] [--out bench/results/cold_warm.json]

By default it fills from half of the sample operators (softmax, layernorm, gelu, transpose) and
evaluates the other half (rmsnorm, rowsum, swiglu, sgemm). `--fill-repo`/`--fill` and `--repo`/`--eval`
name the repos and operators (comma-separated folder names, or `all`): to fill the graph from every
sample operator and measure transfer to operators it has never seen (`bench/unseen_ops`):

    python bench/cold_warm.py --budget 16 --fill-repo sample_ops --fill all --repo bench/unseen_ops --eval all

Repo paths are taken from the current directory, else from the project root. Each repo is copied to a
temporary folder first (without `.kope/`), so neither checkout is touched.
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
SAMPLE_OPS = ROOT / "sample_ops"
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


def repo_path(arg: str) -> Path:
    """A repo named on the command line: from the current directory, else from the project root."""
    for path in (Path(arg), ROOT / arg):
        if path.is_dir():
            return path.resolve()
    sys.exit(f"no operator repo {arg!r} (looked in {Path.cwd()} and {ROOT})")


def operators(repo: Path) -> list[str]:
    """The repo's operator folders: those holding a test module."""
    return sorted(d.name for d in repo.iterdir() if d.is_dir() and any(d.glob("test_*.py")))


def chosen(repo: Path, arg: str, what: str) -> list[str]:
    """`all`, or the comma-separated operators of `arg`, each checked against the repo's folders."""
    found = operators(repo)
    if arg == "all":
        return found
    names = [n for n in arg.split(",") if n]
    if missing := [n for n in names if n not in found]:
        sys.exit(f"--{what}: no operator {', '.join(missing)} in {repo} (it has {', '.join(found)})")
    return names


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cold_warm.json"))
    parser.add_argument("--fill-repo", default=str(SAMPLE_OPS), help="the repo the graph is filled from")
    parser.add_argument("--fill", default=",".join(FILL), help="operators that fill the graph, or all")
    parser.add_argument("--repo", default=str(SAMPLE_OPS), help="the repo of the evaluated operators")
    parser.add_argument("--eval", default=",".join(EVAL), help="operators evaluated cold and warm, or all")
    args = parser.parse_args(argv)
    args.fill_repo, args.repo = repo_path(args.fill_repo), repo_path(args.repo)
    args.fill, args.eval = chosen(args.fill_repo, args.fill, "fill"), chosen(args.repo, args.eval, "eval")
    if not args.fill or not args.eval:
        sys.exit("nothing to fill from or nothing to evaluate")
    if args.fill_repo == args.repo and (both := sorted(set(args.fill) & set(args.eval))):
        print(
            f"note: {', '.join(both)} both fill the graph and are evaluated: warm then measures recall, not transfer"
        )
    return args


def copies(work: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """Copies of the fill repo and the evaluated repo (one copy when they are the same repo)."""
    ignore = shutil.ignore_patterns(".kope", "__pycache__")
    repo = work / "ops"
    shutil.copytree(args.repo, repo, ignore=ignore)
    if args.fill_repo == args.repo:
        return repo, repo
    fill_repo = work / "fill-ops"
    shutil.copytree(args.fill_repo, fill_repo, ignore=ignore)
    return fill_repo, repo


def evaluate(repo: Path, ops: list[str], filled: Path, work: Path, budget: int) -> tuple[dict, dict]:
    """Each operator alone, so neither run learns from the other evaluated operators during the run:
    cold from an empty graph, warm from a fresh copy of the filled one."""
    cold_runs, warm_runs = [], []
    for op in ops:
        cold_runs.append(optimize(repo, [op], work / f"cold-{op}.db", budget, f"cold-{op}"))
        shutil.copy(filled, work / f"warm-{op}.db")
        warm_runs.append(optimize(repo, [op], work / f"warm-{op}.db", budget, f"warm-{op}"))
    cold = {
        "operators": [r["operators"][0] for r in cold_runs],
        "wall_s": sum(r["wall_s"] for r in cold_runs),
        "hardware_name": cold_runs[0].get("hardware_name"),
    }
    warm = {
        "operators": [r["operators"][0] for r in warm_runs],
        "wall_s": sum(r["wall_s"] for r in warm_runs),
    }
    return cold, warm


def tried(op: dict) -> list[dict]:
    """An operator's candidates in evaluation order: idea, point, outcome, in-loop speedup."""
    return [
        {"idea": c["idea"], "params": c["params"], "outcome": c["outcome"], "speedup": c.get("speedup")}
        for c in op.get("candidates", [])
    ]


def duel(repo: Path, op: str, first: dict, second: dict) -> dict:
    """Point `second` against `first`, paired in one child (`head_to_head.py`): > 1, `second` is faster."""
    from head_to_head import head_to_head

    if first == second:
        return {"ratio": 1.0, "low": 1.0, "high": 1.0, "same_point": True}
    return head_to_head(repo, op, first, second)


def level(h2h: dict) -> bool:
    """Head to head, the second point is within 5% of the first or better, or within noise of it."""
    return "ratio" in h2h and (h2h["ratio"] >= REACHED or h2h["high"] >= 1.0)


def evals_to_level(repo: Path, op: str, target: dict, tried: list[dict]) -> int | None:
    """The evaluation at which a search first held an incumbent at `target`'s level: the first point it
    kept (outcome better) that is `target` or matches it head to head.

    Not from the two runs' own speedups: those are chained paired ratios against a committed kernel
    timed at another moment (they moved 10-45% between runs for the same point), and the last step of
    a long lineage is not the first point that was as good. On swiglu, warm's first evaluation was cold's
    winner itself while warm's own best came at its eighth."""
    for i, c in enumerate(tried, 1):
        if c["outcome"] != "better":
            continue
        if level(duel(repo, op, target, c["params"])):
            return i
    return None


def compare(cold: dict, warm: dict, repo: Path) -> tuple[list[dict], list[tuple]]:
    """Per operator: the JSON result and the table row."""
    rows, results = [], []
    for c, w in zip(cold["operators"], warm["operators"]):
        target = (c.get("best") or {}).get("params") or {}
        h2h = duel(repo, c["name"], target, (w.get("best") or {}).get("params") or {})
        cold_to, warm_to = (evals_to_level(repo, c["name"], target, tried(r)) for r in (c, w))
        share = warm_to / cold_to if warm_to and cold_to else None
        results.append(
            {
                "operator": c["name"],
                "cold_speedup": c.get("speedup"),
                "warm_speedup": w.get("speedup"),
                "cold_evals_to_best": c.get("evaluations_to_best"),
                "warm_evals_to_best": w.get("evaluations_to_best"),
                "head_to_head": h2h,
                "warm_level": level(h2h),  # warm's winner within noise of cold's or better
                "cold_evals_to_cold_level": cold_to,
                "warm_evals_to_cold_level": warm_to,
                "warm_over_cold": share,
                # what each search tried, in order: the evidence behind the figures above
                "cold_tried": tried(c),
                "warm_tried": tried(w),
            }
        )
        rows.append(
            (
                c["name"],
                f"{c.get('speedup') or 0:.2f}x ({c.get('evaluations_to_best')})",
                f"{w.get('speedup') or 0:.2f}x ({w.get('evaluations_to_best')})",
                f"{h2h['ratio']:.2f}x [{h2h['low']:.2f}, {h2h['high']:.2f}]"
                if "ratio" in h2h
                else h2h["error"][:40],
                cold_to,
                warm_to if warm_to is not None else "never",
                f"{share:.2f}" if share else "-",
            )
        )
    return results, rows


def show(
    args: argparse.Namespace, fill: dict, cold: dict, warm: dict, results: list[dict], rows: list
) -> None:
    headers = [
        "operator",
        "cold best (evals)",
        "warm best (evals)",
        "warm vs cold winner, head to head",
        "cold evals to its level",
        "warm evals to cold's level",
        "warm/cold",
    ]
    where = "" if args.fill_repo == args.repo == SAMPLE_OPS.resolve() else f" of {label(args.fill_repo)}"
    print(
        f"budget {args.budget} evaluations per operator; filled from {', '.join(args.fill)}{where} "
        f"({fill['wall_s']:.0f} s); cold {cold['wall_s']:.0f} s, warm {warm['wall_s']:.0f} s"
    )
    if args.repo != args.fill_repo:
        print(f"evaluated: {', '.join(args.eval)} of {label(args.repo)}")
    print(tabulate(rows, headers=headers))
    shares = [r["warm_over_cold"] for r in results if r["warm_over_cold"]]
    missed = sum(r["warm_evals_to_cold_level"] is None for r in results)
    at_level = sum(r["warm_level"] for r in results)
    print(
        f"warm's winner within noise of cold's or better on {at_level} of {len(results)}; "
        f"warm never held cold's level on {missed}"
        + (
            f"; median warm/cold evaluations to cold's level {statistics.median(shares):.2f} (goal <= 0.5)"
            if shares
            else ""
        )
    )


def label(repo: Path) -> str:
    """A repo as the JSON and the table name it: relative to the project root when inside it."""
    return str(repo.relative_to(ROOT)) if repo.is_relative_to(ROOT) else str(repo)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    work = Path(tempfile.mkdtemp(prefix="kope-coldwarm-"))
    fill_repo, repo = copies(work, args)
    filled = work / "filled.db"

    fill = optimize(fill_repo, args.fill, filled, args.budget, "fill")
    cold, warm = evaluate(repo, args.eval, filled, work, args.budget)
    results, rows = compare(cold, warm, repo)
    show(args, fill, cold, warm, results, rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "budget": args.budget,
                "fill_repo": label(args.fill_repo),
                "fill": args.fill,
                "repo": label(args.repo),
                "eval": args.eval,
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
