"""How fast does a search find the best point of a space? Replayed over cached timing tables.

Each sample operator's table (bench/tables.py: every valid point judged once, timed paired against
the committed kernel) stands in for the judge, so every search below sees the same numbers and no
timing noise; many seeds each:

- kope cold: the tuner with an empty experience graph;
- kope warm: the tuner with a graph holding a budget-16 cold search of every *other* operator
  (what earlier runs on this machine would have left), recorded and recalled through the real
  SQLite graph;
- kope warm-other-family: the same, from the operators of other families only;
- Kernel Tuner's strategies in simulation mode over the same table (random, greedy ILS, genetic
  algorithm, Bayesian optimization, and others that are cheap).

Larger spaces are composed from measured tables: two-kernel pipelines (rmsnorm then layernorm, 4608
points; softmax then swiglu, 1296) whose time is the sum of their kernels' measured times, every figure
measured, only the composition synthetic. Their knobs are named by position (A_VEC, B_NT, ...), so each
pipeline's warm run recalls the other pipeline's fill search (no kernel in common): transfer between
two large spaces of the same shape, where cold needs tens of evaluations. Searches stop at 100
evaluations.

Reported per operator and strategy, the measured spaces and the composed pipelines in separate
tables, each with its own median over its spaces (a synthetic space never moves the measured ones'
figure): evaluations to reach within 5% of the table's best (median over seeds, with the quartiles), and Kernel Tuner's methodology score over a budget of half the space,
((strategy - random) / (optimum - random) on the best time found so far, averaged over budgets
1..B, with random's expected curve computed exactly from the table). Prints tables, writes JSON.

    python bench/search.py [--seeds 10] [--ops rmsnorm,sgemm] [--strategies random_sample,bayes_opt]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import random
import statistics
import sys
import tempfile
import time
import warnings
from contextlib import redirect_stdout
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kope.agents.tuner.agent import Tuner  # noqa: E402
from pytest_kope.agents.tuner.exploration import point_key  # noqa: E402
from pytest_kope.agents.tuner.search import Memory, Table, TableEvaluator, baseline_of, run_search  # noqa: E402
from pytest_kope.judge.outcome import Judged, Outcome  # noqa: E402
from pytest_kope.memory import distill  # noqa: E402
from pytest_kope.memory.graph import Graph  # noqa: E402

TABLES = ROOT / "bench" / "tables"
WITHIN = 0.95  # within 5% of the best speedup
FILL_BUDGET = 16
MAX_BUDGET = 100  # evaluations per search at most (the composed spaces have 1296 and 4608 points)
# two-kernel pipelines, see compose(); no kernel in two of them, so one warms the other by transfer
COMPOSED = [("rmsnorm", "layernorm"), ("softmax", "swiglu")]
STRATEGIES = [
    "random_sample",
    "greedy_ils",
    "greedy_mls",
    "genetic_algorithm",
    "simulated_annealing",
    "pso",
    "firefly_algorithm",
    "bayes_opt",
]


def load_tables(folder: Path, names: list[str]) -> list[Table]:
    """The cached tables. A table whose source changed since it was measured is still a measured space
    (its own header says which) and serves to compare searches; it is named as such, loudly."""
    tables = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if names and data["operator"] not in names:
            continue
        source = ROOT / "sample_ops" / data["operator"] / f"{data['operator']}.c"
        if (
            source.exists()
            and hashlib.sha256(source.read_text().encode()).hexdigest()[:16] != data["source_hash"]
        ):
            print(
                f"{data['operator']}: table measured an earlier version of the source ({data['source_hash']}); "
                "searched as measured (its header is in the table); python bench/tables.py measures the current one"
            )
        if "header" not in data:
            print(f"{data['operator']}: table has no header: run python bench/tables.py")
            continue
        if len(data["points"]) < data.get("space_size", 0) // 2:  # an interrupted measurement
            print(
                f"{data['operator']}: table has {len(data['points'])} of {data['space_size']} points: run python bench/tables.py"
            )
            continue
        tables.append(Table.from_json(data))
    return tables


def compose(a: Table, b: Table) -> Table:
    """A larger space built from two measured tables: a pipeline running kernel `a` then kernel `b`,
    each with its own knobs (prefixed A_ and B_). Its time is the sum of the two kernels' measured
    times (each committed kernel's seconds, from the table, over the point's speedup); a point is broken
    when either half is. Synthetic in the composition only: every figure in it was measured."""

    def committed_seconds(t: Table) -> float:
        return float(statistics.median(r["seconds"] * r["ratio"] for r in t.rows.values() if r.get("ratio")))

    ta, tb = committed_seconds(a), committed_seconds(b)
    axes: dict[str, list[Any]] = {}
    for prefix, t in (("A_", a), ("B_", b)):
        for name, values in t.info().space.axes.items():
            axes[prefix + name] = list(values)
    lines = [f"// kope: kernel void {a.operator}_{b.operator}(const float *x, float *y, int rows, int cols)"]
    lines += [f"// kope: param {n} = " + " | ".join(json.dumps(v) for v in vs) for n, vs in axes.items()]
    points = []
    for ra in a.rows.values():
        for rb in b.rows.values():
            params = {
                **{"A_" + k: v for k, v in ra["params"].items()},
                **{"B_" + k: v for k, v in rb["params"].items()},
            }
            if ra.get("ratio") and rb.get("ratio"):
                ratio = (ta + tb) / (ta / ra["ratio"] + tb / rb["ratio"])
                points.append({"params": params, "outcome": "ok", "ratio": ratio})
            else:
                points.append({"params": params, "outcome": "incorrect", "failure": "a half is broken"})
    name = f"{a.operator}+{b.operator}"
    return Table(
        name, "pipeline", "\n".join(lines) + "\n", a.hardware, {point_key(p["params"]): p for p in points}
    )


def curve(speedups: list[float | None], budget: int) -> list[float]:
    """Best time found after each of `budget` evaluations (the committed kernel's, 1.0, until one is)."""
    best, out = 1.0, []
    for i in range(budget):
        s = speedups[i] if i < len(speedups) else None
        if s:
            best = min(best, 1.0 / s)
        out.append(best)
    return out


def random_curve(table: Table, budget: int) -> list[float]:
    """Expected best time of `b` distinct points drawn uniformly from the table, b = 1..budget."""
    times = sorted(min(1.0, 1.0 / r["ratio"]) if r.get("ratio") else 1.0 for r in table.rows.values())
    n = len(times)
    out = []
    for b in range(1, budget + 1):
        total = math.comb(n, b)
        out.append(sum(t * math.comb(n - i - 1, b - 1) for i, t in enumerate(times)) / total)
    return out


def score(curves: list[list[float]], rand: list[float], optimum: float) -> float:
    """Kernel Tuner's methodology score: mean over budgets of the seeds' mean best time, against
    random (0) and the optimum (1)."""
    mean = [statistics.fmean(c[b] for c in curves) for b in range(len(rand))]
    num = sum(r - m for r, m in zip(rand, mean))
    den = sum(r - optimum for r in rand)
    return num / den if den > 0 else 1.0


def speedups_of(history: list[Judged]) -> list[float | None]:
    """Each evaluation's speedup (None: broken). A point a subset table lacks is not an evaluation:
    Kernel Tuner never proposes one (its restriction keeps to the table), so neither counts it."""
    return [
        j.speedup if j.outcome.correct else None
        for j in history
        if not (j.outcome == Outcome.REJECTED and j.failures == ["not in the table"])
    ]


def kope_run(
    table: Table, seed: int, graph: Graph | None = None, budget: int | None = None, run_id: str = "search"
) -> list[Judged]:
    info = table.info()
    budget = budget or min(len(table.rows), MAX_BUDGET)
    return run_search(
        Tuner(seed=seed),
        info,
        table.hardware,
        TableEvaluator(table),
        budget,
        Memory(graph, run_id) if graph is not None else None,
    )


def fill(path: Path, fills: dict[str, tuple[Table, list[Judged]]], ops: list[str]) -> Graph:
    """A graph holding the given operators' fill searches, recorded and distilled as a run would."""
    graph = Graph(path)
    for op in ops:
        table, history = fills[op]
        info = table.info()
        task = graph.task_id(info.name, info.family, info.toolchain, table.hardware)
        run_id = f"fill-{op}"
        graph.start_run(run_id, "tuner", table.hardware)
        graph.record(task, run_id, baseline_of(info))
        for j in history:
            graph.record(task, run_id, j)
        distill(graph, task, run_id)
    return graph


def warm_sources(tables: dict[str, Table], composed: set[str], op: str) -> dict[str, list[str]]:
    """The operators whose fill searches a warm run of `op` recalls, by kind of warm run. A sample
    operator: every other one, or those of other families. A pipeline: the pipelines sharing no kernel
    with it (their knobs have the same names; a sample operator's do not, nor is it another family)."""
    if op in composed:
        kernels = set(op.split("+"))
        return {"kope warm": [o for o in composed if o != op and not kernels & set(o.split("+"))]}
    real = [o for o in tables if o not in composed]
    return {
        "kope warm": [o for o in real if o != op],
        "kope warm other-family": [o for o in real if tables[o].family != tables[op].family],
    }


def kernel_tuner_run(table: Table, strategy: str, seed: int, work: Path) -> list[float | None]:
    """Speedups of the distinct points Kernel Tuner evaluated, in order (simulation over the table)."""
    from kernel_tuner import tune_kernel

    space = table.info().space
    names = list(space.axes)
    params = {n: list(range(len(space.axes[n]))) for n in names}  # indices: flag strings hold spaces

    def unmap(p: dict[str, int]) -> dict[str, Any]:
        return {n: space.axes[n][p[n]] for n in names}

    cache_file = work / f"{table.operator}.kt.json"
    if not cache_file.exists():
        cache = {}
        for row in table.rows.values():
            idx = {n: list(space.axes[n]).index(row["params"][n]) for n in names}
            entry: dict[str, Any] = {**idx, "compile_time": 0, "verification_time": 0, "benchmark_time": 0}
            entry["time"] = 1.0 / row["ratio"] if row.get("ratio") else "RuntimeFailedConfig"
            entry["times"] = [entry["time"]] if row.get("ratio") else []
            cache[",".join(str(idx[n]) for n in names)] = entry
        header = {"device_name": "kope-table", "kernel_name": table.operator, "problem_size": [1]}
        cache_file.write_text(
            json.dumps(
                {
                    **header,
                    "tune_params_keys": names,
                    "tune_params": params,
                    "objective": "time",
                    "cache": cache,
                }
            )
        )

    def measured(*values: Any) -> bool:  # the space's constraints, and a subset table's points only
        # Kernel Tuner calls a restriction with the values in order (its solver) or with one dict
        p = values[0] if len(values) == 1 and isinstance(values[0], dict) else dict(zip(names, values))
        return point_key(unmap(p)) in table.rows

    random.seed(seed)
    import numpy as np

    np.random.seed(seed)
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        results, _ = tune_kernel(
            table.operator,
            "__global__ void k() {}",
            1,
            [],
            params,
            restrictions=measured,
            cache=str(cache_file),
            simulation_mode=True,
            strategy=strategy,
            strategy_options={"max_fevals": min(len(table.rows), MAX_BUDGET)},
            verbose=False,
            quiet=True,
        )
    seen: set[str] = set()
    out: list[float | None] = []
    for r in results:
        key = point_key(unmap({n: r[n] for n in names}))
        if key in seen:
            continue
        seen.add(key)
        out.append(1.0 / r["time"] if isinstance(r["time"], float) else None)
    return out


def summarize(evals: list[int | None], total: int) -> dict[str, Any]:
    reached = [e if e is not None else total + 1 for e in evals]
    q = statistics.quantiles(reached, n=4) if len(reached) > 1 else [reached[0]] * 3
    return {"median": statistics.median(reached), "p25": q[0], "p75": q[2], "missed": evals.count(None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, default=TABLES)
    parser.add_argument("--ops", default="")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "search.json")
    parser.add_argument("--no-composed", action="store_true", help="skip the two-kernel pipeline spaces")
    args = parser.parse_args(argv)
    tables = {t.operator: t for t in load_tables(args.tables, [n for n in args.ops.split(",") if n])}
    if not tables:
        print("no usable tables: run python bench/tables.py first")
        return 1
    composed = set()
    if not args.no_composed:
        for a, b in COMPOSED:
            if a in tables and b in tables:
                pipeline = compose(tables[a], tables[b])
                composed.add(pipeline.operator)
                tables[pipeline.operator] = pipeline
    strategies = [s for s in args.strategies.split(",") if s]
    shm = Path("/dev/shm")  # the replay's graphs need no durability: spare the disk thousands of fsyncs
    work = Path(tempfile.mkdtemp(prefix="kope-search-", dir=shm if shm.is_dir() else None))
    started = time.monotonic()
    speedups: dict[str, dict[str, list[list[float | None]]]] = {op: {} for op in tables}

    def add(op: str, name: str, history: list[float | None]) -> None:
        speedups[op].setdefault(name, []).append(history)

    cold: dict[tuple[str, int], list[Judged]] = {}
    for op, table in tables.items():
        for seed in range(args.seeds):
            cold[(op, seed)] = kope_run(table, seed)
            add(op, "kope cold", speedups_of(cold[(op, seed)]))
    for seed in range(args.seeds):
        fills = {op: (tables[op], cold[(op, seed)][:FILL_BUDGET]) for op in tables}
        for op, table in tables.items():
            for name, others in warm_sources(tables, composed, op).items():
                graph = fill(work / f"{name.replace(' ', '-')}-{op}-{seed}.db", fills, others)
                try:
                    # a different seed than the fill's: the warm search must not replay the same draws
                    history = kope_run(table, seed + 500, graph=graph, run_id=f"warm-{op}")
                finally:
                    graph.close()
                add(op, name, speedups_of(history))
    try:
        kt_version = version("kernel_tuner")
    except PackageNotFoundError:
        kt_version = "not installed"
        print("Kernel Tuner is not installed: its strategies are left out (pip install -e '.[bench]')")
        strategies = []
    for op, table in tables.items():
        for strategy in strategies:
            for seed in range(args.seeds):
                try:
                    add(op, strategy, kernel_tuner_run(table, strategy, seed, work))
                except Exception as exc:  # a strategy that cannot handle this space: reported, not fatal
                    print(f"{op}: Kernel Tuner {strategy} failed: {type(exc).__name__}: {exc}")
                    break
    results = report(tables, speedups, composed)
    meta = {
        "kernel_tuner": kt_version,
        "seeds": args.seeds,
        "fill_budget": FILL_BUDGET,
        "hardware": next(iter(tables.values())).hardware,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(f"kernel_tuner {meta['kernel_tuner']}, {args.seeds} seeds, {meta['wall_s']} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    meta["composed"] = sorted(composed)  # synthetic spaces, reported apart from the measured ones
    args.json.write_text(json.dumps({**meta, "results": results}, indent=1, default=str))
    print(f"wrote {args.json}")
    return 0


def report(
    tables: dict[str, Table], speedups: dict[str, dict[str, list[list[float | None]]]], composed: set[str]
) -> dict[str, Any]:
    """Tables per group: the measured spaces, then the composed pipelines apart, each group with its
    own median over its spaces (a synthetic space never weighs in the real ones' figure)."""
    names = list(dict.fromkeys(n for per in speedups.values() for n in per))
    results: dict[str, Any] = {op: summaries(table, speedups[op]) for op, table in tables.items()}
    groups = [
        ("measured spaces", "median over operators", [op for op in tables if op not in composed]),
        ("composed pipelines (synthetic)", "median over pipelines", [op for op in tables if op in composed]),
    ]
    for title, median_label, ops in groups:
        if not ops:
            continue
        evals_rows: list[list[Any]] = []
        score_rows: list[list[Any]] = []
        for op in ops:
            found = results[op]
            evals_rows.append([f"{op} ({found['space']})"] + [evals_cell(found.get(n)) for n in names])
            score_rows.append([op] + [f"{found[n]['score']:.2f}" if n in found else "-" for n in names])
        med_row: list[Any] = [median_label]
        mean_row: list[Any] = ["mean"]
        for name in names:
            meds = [results[op][name]["median"] for op in ops if name in results[op]]
            scores = [results[op][name]["score"] for op in ops if name in results[op]]
            med_row.append(f"{statistics.median(meds):g}" if meds else "-")
            mean_row.append(f"{statistics.fmean(scores):.2f}" if scores else "-")
        print(f"\n{title}: evaluations to within 5% of the space's best, median over seeds [quartiles]")
        print(tabulate([*evals_rows, med_row], headers=["operator (points)", *names]))
        print(
            f"\n{title}: methodology score over a budget of half the space ((strategy - random) / (optimum - random))"
        )
        print(tabulate([*score_rows, mean_row], headers=["operator", *names]))
    return results


def summaries(table: Table, runs_by_name: dict[str, list[list[float | None]]]) -> dict[str, Any]:
    """One space's figures: per search, evaluations to within 5% of its best and the score."""
    best, size = table.best(), len(table.rows)
    cap = min(size, MAX_BUDGET)
    budget = min(max(4, math.ceil(size / 2)), MAX_BUDGET // 2, size)
    rand = random_curve(table, budget)
    found: dict[str, Any] = {"space": size, "best": best, "budget": budget, "family": table.family}
    for name, runs in runs_by_name.items():
        evals = [next((i for i, s in enumerate(r, 1) if (s or 0) >= WITHIN * best), None) for r in runs]
        found[name] = summarize(evals, cap)
        found[name]["score"] = score([curve(r, budget) for r in runs], rand, 1.0 / best)
    return found


def evals_cell(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "-"
    missed = f" ({summary['missed']} missed)" if summary["missed"] else ""
    return f"{summary['median']:g} [{summary['p25']:g}-{summary['p75']:g}]{missed}"


if __name__ == "__main__":
    raise SystemExit(main())
