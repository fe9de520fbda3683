"""Does the experience graph make the tuner better? Cold (empty graph) against warm, side by side.

1. fill: the tuner optimizes some operators (of one repo), filling a graph;
2. cold: the tuner optimizes other operators (of the same repo or another) with an empty graph;
3. warm: the same, same budget, starting from a copy of the filled graph.

Cold and warm run each operator on its own, so that no run learns from another evaluated operator.

All three are repeated for each of `--seeds` seeds (`--kope-seed`, the tuner's draws): a seed is one
replicate, with its own fill. Which arm runs first alternates with the seed and the operator, so
neither always meets a fresh (or a tired) machine first.

For each operator it prints, as the median over the seeds with the range: each run's verified best,
warm's winner against cold's head to head (paired in one child), and at which evaluation each run
first kept a point at cold's winner's level (its head-to-head median ratio at least 0.95; the goal:
warm in at most half of cold's evaluations; a warm run that never gets there counts as budget + 1,
never as left out, or the seeds where warm does worst would vanish from the median). Warm "reached"
cold's level on an operator when the median over the seeds of the head-to-head ratio is at least
0.95. Every two seeds' cold winners are also timed head to head: how often one cold run ends worse
than another beyond noise is the rate "warm worse beyond noise" is read against. Writes JSON, every
seed's run in it.

    python bench/cold_warm.py [--budget 16] [--seeds 4] [--out bench/results/cold_warm.json]

By default it fills from half of the sample operators (softmax, layernorm, gelu, transpose) and
evaluates the other half (rmsnorm, rowsum, swiglu, sgemm). `--fill-repo`/`--fill` and `--repo`/`--eval`
name the repos and operators (comma-separated folder names, or `all`): to fill the graph from every
sample operator and measure transfer to operators it has never seen (`bench/unseen_ops`):

    python bench/cold_warm.py --budget 16 --fill-repo sample_ops --fill all --repo bench/unseen_ops --eval all

and, within a family the graph knows (`bench/large_ops`: each large kernel's sibling at another shape):

    python bench/cold_warm.py --budget 24 --seeds 5 --fill-repo bench/large_ops --fill conv1d,bmm \
        --repo bench/large_ops --eval conv1d_k3,bmm_wide

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
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shape_shift import over_cold  # noqa: E402

SAMPLE_OPS = ROOT / "sample_ops"
FILL = ["softmax", "layernorm", "gelu", "transpose"]
EVAL = ["rmsnorm", "rowsum", "swiglu", "sgemm"]
REACHED = 0.95  # within 5% of the cold best counts as reaching it: paired timing noise is of that order


def optimize(repo: Path, ops: list[str], db: Path, budget: int, label: str, seed: int) -> dict[str, Any]:
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
        "--kope-seed",
        str(seed),
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
    data: dict[str, Any] = json.loads(report.read_text())
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
    parser.add_argument("--fill-budget", type=int, default=None, help="the fill's budget (default: --budget)")
    parser.add_argument("--seeds", type=int, default=4, help="replicates: fill, cold and warm with each seed")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cold_warm.json"))
    parser.add_argument("--fill-repo", default=str(SAMPLE_OPS), help="the repo the graph is filled from")
    parser.add_argument("--fill", default=",".join(FILL), help="operators that fill the graph, or all")
    parser.add_argument("--repo", default=str(SAMPLE_OPS), help="the repo of the evaluated operators")
    parser.add_argument("--eval", default=",".join(EVAL), help="operators evaluated cold and warm, or all")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.budget < 1:
        sys.exit("--seeds and --budget must be at least 1")
    args.seed_list = list(range(args.first_seed, args.first_seed + args.seeds))
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


def arm_order(seed: int, index: int) -> list[str]:
    """Which arm runs first: alternating with the seed and with the operator's place, so that over
    the seeds each arm goes first on half of each operator's runs."""
    return ["cold", "warm"] if (seed + index) % 2 == 0 else ["warm", "cold"]


def evaluate(
    repo: Path, ops: list[str], filled: Path, work: Path, budget: int, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each operator alone, so neither run learns from the other evaluated operators during the run:
    cold from an empty graph, warm from a fresh copy of the filled one. Which arm runs first
    alternates with the seed and the operator, so neither always meets the machine first."""
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    for i, op in enumerate(ops):
        shutil.copy(filled, work / f"warm-{op}-{seed}.db")
        arms = arm_order(seed, i)
        for arm in arms:
            runs[arm].append(
                optimize(repo, [op], work / f"{arm}-{op}-{seed}.db", budget, f"{arm}-{op}-{seed}", seed)
            )
        runs["cold"][-1]["first"] = arms[0]
    cold, warm = (
        {
            "operators": [r["operators"][0] for r in runs[arm]],
            "wall_s": sum(r["wall_s"] for r in runs[arm]),
            "hardware_name": runs[arm][0].get("hardware_name"),
            "first": [r.get("first") for r in runs["cold"]],
        }
        for arm in ("cold", "warm")
    )
    return cold, warm


def tried(op: dict[str, Any]) -> list[dict[str, Any]]:
    """An operator's candidates in evaluation order: idea, point, outcome, in-loop speedup."""
    return [
        {"idea": c["idea"], "params": c["params"], "outcome": c["outcome"], "speedup": c.get("speedup")}
        for c in op.get("candidates", [])
    ]


def duel(repo: Path, op: str, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Point `second` against `first`, paired in one child (`head_to_head.py`): > 1, `second` is faster."""
    from bench.head_to_head import head_to_head

    if first == second:
        return {"ratio": 1.0, "low": 1.0, "high": 1.0, "same_point": True}
    return head_to_head(repo, op, first, second)


def level(h2h: dict[str, Any]) -> bool:
    """Head to head, the second point's median ratio is within 5% of the first or better (an
    interval's upper end above 1 says only that the test could not tell, not that it is as good)."""
    return "ratio" in h2h and h2h["ratio"] >= REACHED


def evals_to_level(repo: Path, op: str, target: dict[str, Any], tried: list[dict[str, Any]]) -> int | None:
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


def compare(
    cold: dict[str, Any], warm: dict[str, Any], repo: Path, seed: int, budget: int
) -> list[dict[str, Any]]:
    """Per operator, one seed's result: both runs' figures, warm's winner head to head with cold's
    (warm/cold evaluations to cold's level: `shape_shift.over_cold`)."""
    results = []
    for c, w, first in zip(cold["operators"], warm["operators"], cold["first"]):
        target = (c.get("best") or {}).get("params") or {}
        h2h = duel(repo, c["name"], target, (w.get("best") or {}).get("params") or {})
        cold_to, warm_to = (evals_to_level(repo, c["name"], target, tried(r)) for r in (c, w))
        results.append(
            {
                "operator": c["name"],
                "seed": seed,
                "first": first,
                "cold_best": target,
                "warm_best": (w.get("best") or {}).get("params") or {},
                "cold_speedup": c.get("speedup"),
                "warm_speedup": w.get("speedup"),
                "cold_evals_to_best": c.get("evaluations_to_best"),
                "warm_evals_to_best": w.get("evaluations_to_best"),
                "head_to_head": h2h,
                "warm_level": level(h2h),  # warm's winner's median ratio within 5% of cold's or better
                "cold_evals_to_cold_level": cold_to,
                "warm_evals_to_cold_level": warm_to,
                "warm_over_cold": over_cold(warm_to, cold_to, budget),
                # beyond noise: the head-to-head interval's upper end below 1
                "warm_worse": h2h.get("high", 1.0) < 1.0,
                **{
                    f"{arm}_{k}": v
                    for arm, r in (("cold", c), ("warm", w))
                    for k, v in how_it_ended(r).items()
                },
                # what each search tried, in order: the evidence behind the figures above
                "cold_tried": tried(c),
                "warm_tried": tried(w),
            }
        )
    return results


def cold_against_cold(repo: Path, results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per operator, every pair of two seeds' cold winners head to head: how often one cold run ends
    worse than another beyond noise. A search with a budget far below its space's size ends in
    different places with different seeds, so "warm ends worse than cold beyond noise" is read against
    this rate, which no seed of any search can be held under: cold is not always at cold's level."""
    out = {}
    for op in dict.fromkeys(r["operator"] for r in results):
        winners = [r["cold_best"] for r in results if r["operator"] == op]
        pairs = [(a, b) for i, a in enumerate(winners) for b in winners[i + 1 :]]
        duels = [duel(repo, op, a, b) for a, b in pairs]
        differ = sum("low" in d and (d["high"] < 1.0 or d["low"] > 1.0) for d in duels)
        out[op] = {
            "pairs": len(pairs),
            "differ_beyond_noise": differ,
            "worse_rate": differ / (2 * len(pairs)) if pairs else None,
            "duels": duels,
        }
    return out


def how_it_ended(op: dict[str, Any]) -> dict[str, Any]:
    """A run's evaluations, why it stopped, and the axes it never explored around its best point."""
    return {
        "evaluations": op.get("evaluations"),
        "stopped": (op.get("stopped") or {}).get("short"),
        "untried_axes": (op.get("exploration") or {}).get("untried", []),
    }


def spread(values: list[float | None], fmt: str = "{:.2f}") -> str:
    """Median [min-max] of the values present, with how many are missing: the seeds' spread."""
    present = sorted(v for v in values if v is not None)
    if not present:
        return "-"
    text = fmt.format(statistics.median(present))
    if len(present) > 1:
        text += f" [{fmt.format(present[0])}-{fmt.format(present[-1])}]"
    missing = len(values) - len(present)
    return text + (f" ({missing} never)" if missing else "")


def per_operator(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each operator over the seeds: medians, ranges, and whether warm reached cold's level, decided
    by the median over the seeds of the head-to-head ratio."""
    summary = []
    for op in dict.fromkeys(r["operator"] for r in results):
        mine = [r for r in results if r["operator"] == op]
        ratios = [r["head_to_head"]["ratio"] for r in mine if "ratio" in r["head_to_head"]]
        shares = [r["warm_over_cold"] for r in mine if r["warm_over_cold"] is not None]
        summary.append(
            {
                "operator": op,
                "seeds": len(mine),
                "head_to_head_median": statistics.median(ratios) if ratios else None,
                "head_to_head_range": [min(ratios), max(ratios)] if ratios else None,
                "warm_level": bool(ratios) and statistics.median(ratios) >= REACHED,
                "warm_over_cold_median": statistics.median(shares) if shares else None,
                "warm_never": sum(r["warm_evals_to_cold_level"] is None for r in mine),
                "warm_worse_beyond_noise": sum(r["warm_worse"] for r in mine),
            }
        )
    return summary


def rows_of(
    results: list[dict[str, Any]], summary: list[dict[str, Any]], aa: dict[str, dict[str, Any]]
) -> list[list[Any]]:
    rows = []
    for s in summary:
        mine = [r for r in results if r["operator"] == s["operator"]]
        pair = aa.get(s["operator"])
        rows.append(
            [
                s["operator"],
                spread([r["cold_speedup"] for r in mine]),
                spread([r["warm_speedup"] for r in mine]),
                spread([r["head_to_head"].get("ratio") for r in mine]),
                "yes" if s["warm_level"] else "no",
                spread([r["cold_evals_to_cold_level"] for r in mine], "{:g}"),
                spread([r["warm_evals_to_cold_level"] for r in mine], "{:g}"),
                spread([r["warm_over_cold"] for r in mine]),
                f"{s['warm_worse_beyond_noise']} of {len(mine)}",
                f"{pair['differ_beyond_noise']} of {2 * pair['pairs']}" if pair else "-",
                spread([r["cold_evaluations"] for r in mine], "{:g}"),
                spread([r["warm_evaluations"] for r in mine], "{:g}"),
            ]
        )
    return rows


def show(
    args: argparse.Namespace,
    walls: dict[str, float],
    results: list[dict[str, Any]],
    aa: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    headers = [
        "operator",
        "cold best",
        "warm best",
        "warm vs cold winner, head to head",
        "warm at cold's level",
        "cold evals to its level",
        "warm evals to cold's level",
        "warm/cold",
        "warm worse beyond noise",
        "a cold worse than another beyond noise",
        "cold evals",
        "warm evals",
    ]
    where = "" if args.fill_repo == args.repo == SAMPLE_OPS.resolve() else f" of {label(args.fill_repo)}"
    print(
        f"budget {args.budget} evaluations per operator (fill {args.fill_budget or args.budget}); "
        f"{len(args.seed_list)} seeds "
        f"({', '.join(map(str, args.seed_list))}), each its own fill, cold and warm runs (--kope-seed), "
        f"cold first on half of the runs; filled from {', '.join(args.fill)}{where} ({walls['fill']:.0f} s); "
        f"cold {walls['cold']:.0f} s, warm {walls['warm']:.0f} s"
    )
    if args.repo != args.fill_repo:
        print(f"evaluated: {', '.join(args.eval)} of {label(args.repo)}")
    summary = per_operator(results)
    print("median over the seeds [min-max]; head to head: warm's winner over cold's, > 1 is warm faster")
    print(tabulate(rows_of(results, summary, aa), headers=headers))
    shares = [s["warm_over_cold_median"] for s in summary if s["warm_over_cold_median"]]
    at_level = sum(s["warm_level"] for s in summary)
    print(
        f"warm's winner at cold's level (median head-to-head ratio >= {REACHED}) on {at_level} of {len(summary)}"
        + (
            f"; median over operators of warm/cold evaluations to cold's level {statistics.median(shares):.2f} (goal <= 0.5)"
            if shares
            else ""
        )
    )
    return summary


def label(repo: Path) -> str:
    """A repo as the JSON and the table name it: relative to the project root when inside it."""
    return str(repo.relative_to(ROOT)) if repo.is_relative_to(ROOT) else str(repo)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    work = Path(tempfile.mkdtemp(prefix="kope-coldwarm-"))
    fill_repo, repo = copies(work, args)
    results: list[dict[str, Any]] = []
    walls = {"fill": 0.0, "cold": 0.0, "warm": 0.0}
    hardware = None
    for seed in args.seed_list:
        filled = work / f"filled-{seed}.db"
        fill = optimize(fill_repo, args.fill, filled, args.fill_budget or args.budget, f"fill-{seed}", seed)
        cold, warm = evaluate(repo, args.eval, filled, work, args.budget, seed)
        results += compare(cold, warm, repo, seed, args.budget)
        walls["fill"] += fill["wall_s"]
        walls["cold"] += cold["wall_s"]
        walls["warm"] += warm["wall_s"]
        hardware = hardware or cold.get("hardware_name")
    aa = cold_against_cold(repo, results)
    summary = show(args, walls, results, aa)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "budget": args.budget,
                "fill_budget": args.fill_budget or args.budget,
                "seeds": args.seed_list,
                "fill_repo": label(args.fill_repo),
                "fill": args.fill,
                "repo": label(args.repo),
                "eval": args.eval,
                "reached": f"median head-to-head ratio over the seeds >= {REACHED}",
                "summary": summary,
                "cold_against_cold": aa,
                "results": results,
                "hardware": hardware,
                "wall_s": walls,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
