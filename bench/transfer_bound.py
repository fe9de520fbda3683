"""What could the experience graph save at most on an operator of another family? Replayed over tables.

Issue 39 asks a warm start to reach cold's final level in half of cold's evaluations on operators the
graph has never seen. On such an operator the graph can know only the axes the target shares with the
operators it was filled from (vector length, streaming stores, threads, flag sets); the target's own
axes (algorithm, blocks, tiles) are news to it. This bench measures how much knowing the shared axes
is worth, by four searches of the same target table, many seeds each, each with an optimize run's
batch and patience:

- cold: the tuner with an empty graph;
- warm: the tuner from a graph filled by budget-16 searches of the fill tables;
- held at the best: cold, with the shared axes held at the target table's best point (a perfect
  transfer of everything they share: what no graph of other families can better, for this tuner);
- held at the graph's word: cold, with the shared axes held at warm's first proposal (the values the
  filled graph ranks best: transfer without doubt).

`--hold THREADS,flags` holds only those of the shared axes (the rest are searched as cold searches them).

A held search runs on the table restricted to its held values, its speedups taken against the held
point at the target's own defaults (its committed kernel there), so the tuner sees what a search of
that smaller space would. Reported per search, median over seeds: evaluations to cold's final level
(the first kept point within 5% of it; 0 when the held point is there already; a search that never
gets there counts as budget + 1), that
over cold's own, the final speedup, and how often it ends worse than cold by more than 5%. Fill and
target tables must come from one machine (`bench/tables.py` names it in each table).

    python bench/transfer_bound.py [--seeds 20] [--eval stencil2d] [--hold THREADS,flags] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.shape_shift import BUDGET, PACE, WORSE, final, first_at, load, over_cold, tuned  # noqa: E402
from pytest_kope.agents.base import OperatorInfo  # noqa: E402
from pytest_kope.agents.tuner.search import Memory, Table  # noqa: E402
from pytest_kope.memory import Graph  # noqa: E402
from pytest_kope.spec import Scalar  # noqa: E402

TABLES = ROOT / "bench" / "tables"
FILL = ["softmax", "layernorm", "gelu", "transpose"]
FILL_BUDGET = 16
SEARCHES = ["cold", "warm", "held at the best", "held at the graph's word"]
MACHINE = ("model", "simd_level", "cores")  # what must match for fill and target to be one machine


def one_machine(target: Table, fills: list[Table]) -> None:
    """Transfer is measured on one machine: a fill table from another would relabel its hardware."""
    want = [target.hardware.get(k) for k in MACHINE]
    for fill in fills:
        if [fill.hardware.get(k) for k in MACHINE] != want:
            raise SystemExit(
                f"{fill.operator}'s table was measured on {fill.hardware.get('model')}, {target.operator}'s on "
                f"{target.hardware.get('model')}: measure both on one machine with python bench/tables.py"
            )


def shared_axes(target: Table, fills: list[Table]) -> list[str]:
    """The target's axes that some fill operator declares too: all the graph can speak for."""
    theirs = {axis for fill in fills for axis in fill.info().space.axes}
    return [axis for axis in target.info().space.axes if axis in theirs]


def held(target: Table, values: dict[str, Scalar]) -> tuple[OperatorInfo, Table, float]:
    """The target with `values` held: its info on the smaller space, its table restricted to it with
    speedups over the held point at the other axes' defaults, and that point's own speedup."""
    info = target.info()
    axes = {n: (values[n],) if n in values else vs for n, vs in info.space.axes.items()}
    space = replace(info.space, axes=axes)
    base = target.speedup(space.defaults)
    if base is None:
        raise SystemExit(f"{target.operator}: the held point {space.defaults} is broken in its table")
    rows = {
        key: {**row, "ratio": row["ratio"] / base} if row.get("ratio") else row
        for key, row in target.rows.items()
        if all(row["params"][n] == v for n, v in values.items())
    }
    return replace(info, space=space), replace(target, rows=rows), base


def searched(target: Table, fills: list[Table], hold: list[str], seed: int, work: Path) -> dict[str, Any]:
    """One seed: each search's final speedup and its evaluations, and cold's to its own final level;
    the held searches hold the axes `hold`."""
    hw = target.hardware
    runs: dict[str, tuple[float, list[Any]]] = {"cold": (1.0, tuned(target, seed, hw))}
    graph = Graph(work / f"{target.operator}-{seed}.db")
    try:
        for i, fill in enumerate(fills):
            tuned(fill, seed + 100 + i, hw, Memory(graph, f"fill-{fill.operator}"), FILL_BUDGET)
        warm = tuned(target, seed + 500, hw, Memory(graph, "warm"))
    finally:
        graph.close()
    runs["warm"] = (1.0, warm)
    best = max(target.points(), key=lambda p: target.speedup(p) or 0.0)
    word = warm[0].candidate.params if warm else target.info().space.defaults
    for name, point in (("held at the best", best), ("held at the graph's word", word)):
        info, table, base = held(target, {axis: point[axis] for axis in hold})
        runs[name] = (base, tuned(table, seed + 300, hw, info=info))
    cold = runs["cold"][1]
    level = final(cold)
    out: dict[str, Any] = {"seed": seed, "held_at_best": {a: best[a] for a in hold}}
    out["held_at_word"] = {a: word[a] for a in hold}
    for name, (base, history) in runs.items():
        out[name] = {
            "final": base * final(history),
            "evaluations": len(history),
            "to_cold_level": 0 if base != 1.0 and base * WORSE >= level else first_at(history, level / base),
        }
    return out


def summary(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """One search over the seeds (medians); never at cold's level counts as budget + 1 (a seed whose
    cold search never gained has no level to reach: left out of the ratio)."""
    to = [BUDGET + 1 if (t := r[name]["to_cold_level"]) is None else t for r in rows]
    shares = [
        s for r in rows if (s := over_cold(r[name]["to_cold_level"], r["cold"]["to_cold_level"])) is not None
    ]
    q = statistics.quantiles(to, n=4) if len(to) > 1 else [to[0]] * 3
    return {
        "search": name,
        "to_cold_level": statistics.median(to),
        "to_cold_level_iqr": [q[0], q[2]],
        "never": sum(r[name]["to_cold_level"] is None for r in rows),
        "over_cold": statistics.median(shares or [math.nan]),
        "final": statistics.median(r[name]["final"] for r in rows),
        "worse": sum(r[name]["final"] * WORSE < r["cold"]["final"] for r in rows),
        "evaluations": statistics.median(r[name]["evaluations"] for r in rows),
    }


def cold_worse_rate(rows: list[dict[str, Any]]) -> float:
    """How often one cold seed ends worse than another by more than 5%: the rate "worse" is read against."""
    colds = [r["cold"]["final"] for r in rows]
    pairs = [(a, b) for i, a in enumerate(colds) for j, b in enumerate(colds) if i != j]
    return sum(a * WORSE < b for a, b in pairs) / len(pairs) if pairs else 0.0


def show(results: list[dict[str, Any]]) -> None:
    """Per target, a table: one row a search."""
    for r in results:
        print(
            f"\n{r['operator']}: shared axes {', '.join(r['shared_axes'])}, held {', '.join(r['held_axes'])} "
            f"({len(r['runs'])} seeds, budget {BUDGET})"
        )
        print(
            tabulate(
                [
                    [
                        s["search"],
                        f"{s['to_cold_level']:g} [{s['to_cold_level_iqr'][0]:g}-{s['to_cold_level_iqr'][1]:g}]",
                        s["never"],
                        f"{s['over_cold']:.2f}",
                        f"{s['final']:.1f}",
                        f"{s['worse']} of {len(r['runs'])}",
                    ]
                    for s in r["searches"]
                ],
                headers=[
                    "search",
                    "evals to cold's level",
                    "never",
                    "over cold's (median)",
                    "final speedup",
                    "worse than cold by >5%",
                ],
            )
        )
        print(f"one cold seed worse than another by >5%: {r['cold_worse_than_cold']:.0%} of pairs")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, default=TABLES / "large_ops", help="the target tables")
    parser.add_argument("--fill-tables", type=Path, default=TABLES / "epyc_avx2", help="the fill tables")
    parser.add_argument("--fill", default=",".join(FILL))
    parser.add_argument("--eval", default="stencil2d")
    parser.add_argument("--hold", default="", help="hold only these shared axes (default: all of them)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "transfer_bound.json")
    args = parser.parse_args(argv)
    fills = [load(n, args.fill_tables) for n in args.fill.split(",") if n]
    work = Path(tempfile.mkdtemp(prefix="kope-bound-"))
    results = []
    for name in (n for n in args.eval.split(",") if n):
        target = load(name, args.tables)
        one_machine(target, fills)
        shared = shared_axes(target, fills)
        hold = [a for a in args.hold.split(",") if a] or shared
        if set(hold) - set(shared):
            raise SystemExit(
                f"--hold {args.hold}: {name} shares only {', '.join(shared)} with the fill operators"
            )
        if len(shared) == len([a for a, vs in target.info().space.axes.items() if len(vs) > 1]):
            raise SystemExit(f"{name} shares every axis with the fill operators: see bench/shape_shift.py")
        rows = [searched(target, fills, hold, seed, work) for seed in range(args.seeds)]
        results.append(
            {
                "operator": name,
                "shared_axes": shared,
                "held_axes": hold,
                "cold_worse_than_cold": cold_worse_rate(rows),
                "searches": [summary(rows, s) for s in SEARCHES],
                "runs": rows,
            }
        )
    show(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"budget": BUDGET, "fill_budget": FILL_BUDGET, "pace": asdict(PACE), "fill": args.fill}
    args.out.write_text(json.dumps({**payload, "results": results}, indent=1, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
