"""A family's optimum at another shape: cold against warm, replayed over measured tables.

`bench/large_ops`' bmm and bmm_wide judge one kernel source at two shapes; their optimum tiles differ
(n = 40 takes 8-wide tiles, n = 96 takes 32-wide ones, and `MT * NB <= 128` makes the way from one to
the other a move on two axes). Their measured tables (`bench/tables/large_ops`, every valid point
judged once on the machine named in them) stand in for the judge, so many seeds cost seconds: for
each seed, a cold search of the target, a search of the other shape recorded in a fresh graph, then a
warm search of the target from that graph, each with an optimize run's batch and patience. Reported
per direction: how often warm ends worse than cold's final point by more than 5%, against how often
one cold seed ends that much worse than another, and warm's evaluations to cold's final level.

    python bench/shape_shift.py [--seeds 60] [--tables bench/tables/large_ops] [--out bench/results/shape_shift.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kope.agents.base import OperatorInfo  # noqa: E402
from pytest_kope.agents.tuner.agent import Tuner  # noqa: E402
from pytest_kope.agents.tuner.search import Memory, Pace, Table, TableEvaluator, run_search  # noqa: E402
from pytest_kope.judge.outcome import Judged, Outcome  # noqa: E402
from pytest_kope.memory import Graph  # noqa: E402

TABLES = ROOT / "bench" / "tables" / "large_ops"
PACE = Pace(patience=8, batch=4)  # an optimize run's defaults on two workers
BUDGET = 24
WORSE = 1.05  # a final point more than 5% slower than another's


def load(name: str, folder: Path = TABLES) -> Table:
    path = folder / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"{path}: no such table; measure it with python bench/tables.py --out {folder}")
    return Table.from_json(json.loads(path.read_text()))


def over_cold(to: int | None, cold_to: int | None, budget: int = BUDGET) -> float | None:
    """Evaluations to cold's final level over cold's own. A search that never got there counts as
    `budget` + 1 (a lower bound: it might have got there later), never as left out, or the seeds where
    it did worst would vanish from a median; 0 (a held point already there) stays 0. None only when
    cold has no level to reach (it never kept a point)."""
    return (budget + 1 if to is None else to) / cold_to if cold_to else None


def final(history: list[Judged]) -> float:
    """The speedup of the point a search ends on (its last gain; 1: the committed kernel)."""
    kept = [j.speedup or 1.0 for j in history if j.outcome == Outcome.BETTER]
    return kept[-1] if kept else 1.0


def first_at(history: list[Judged], level: float) -> int | None:
    """The evaluation at which a search first kept a point within 5% of `level`."""
    for i, j in enumerate(history, 1):
        if j.outcome == Outcome.BETTER and (j.speedup or 0.0) * WORSE >= level:
            return i
    return None


def tuned(
    table: Table,
    seed: int,
    hardware: dict[str, Any],
    memory: Memory | None = None,
    budget: int = BUDGET,
    info: OperatorInfo | None = None,
) -> list[Judged]:
    """The tuner's search of `table` on `hardware`, paced as an optimize run paces it, over the space
    `info` declares (default: the table's own); with `memory`, recorded in that graph and recalled."""
    info = info or table.info()
    return run_search(Tuner(seed=seed), info, hardware, TableEvaluator(table), budget, memory, PACE)


def replay(fill: Table, target: Table, seeds: int, work: Path) -> list[dict[str, Any]]:
    """Per seed: cold's and warm's final speedups, evaluations spent and to cold's final level."""
    rows = []
    for seed in range(seeds):
        hw = target.hardware  # one machine: the fill is "its family, here"
        cold = tuned(target, seed, hw)
        graph = Graph(work / f"{fill.operator}-{target.operator}-{seed}.db")
        try:
            tuned(fill, seed + 100, hw, Memory(graph, "fill"))
            warm = tuned(target, seed + 500, hw, Memory(graph, "warm"))
        finally:
            graph.close()
        level = final(cold)
        rows.append(
            {
                "seed": seed,
                "cold": level,
                "warm": final(warm),
                "cold_evaluations": len(cold),
                "warm_evaluations": len(warm),
                "cold_to_level": first_at(cold, level),
                "warm_to_level": first_at(warm, level),
            }
        )
    return rows


def summary(direction: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    colds = [r["cold"] for r in rows]
    pairs = [(a, b) for i, a in enumerate(colds) for j, b in enumerate(colds) if i != j]
    shares = [s for r in rows if (s := over_cold(r["warm_to_level"], r["cold_to_level"])) is not None]
    return {
        "direction": direction,
        "seeds": len(rows),
        "warm_worse": sum(r["warm"] * WORSE < r["cold"] for r in rows),
        "cold_worse_than_cold": sum(a * WORSE < b for a, b in pairs) / len(pairs) if pairs else None,
        "warm_never_at_cold_level": sum(r["warm_to_level"] is None for r in rows),
        "warm_over_cold_evaluations": statistics.median(shares) if shares else None,
        "cold_evaluations": statistics.median(r["cold_evaluations"] for r in rows),
        "warm_evaluations": statistics.median(r["warm_evaluations"] for r in rows),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--tables", type=Path, default=TABLES, help="where bmm.json and bmm_wide.json are")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "shape_shift.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kope-shift-"))
    results = []
    for fill, target in (("bmm", "bmm_wide"), ("bmm_wide", "bmm")):
        rows = replay(load(fill, args.tables), load(target, args.tables), args.seeds, work)
        results.append({**summary(f"{fill} -> {target}", rows), "runs": rows})
    print(
        tabulate(
            [
                [
                    r["direction"],
                    f"{r['warm_worse']} of {r['seeds']}",
                    f"{r['cold_worse_than_cold']:.0%}",
                    r["warm_never_at_cold_level"],
                    r["warm_over_cold_evaluations"],
                    f"{r['cold_evaluations']:g} / {r['warm_evaluations']:g}",
                ]
                for r in results
            ],
            headers=[
                "graph -> target",
                "warm worse than cold by >5%",
                "a cold seed worse than another",
                "warm never at cold's level",
                "warm/cold evals to cold's level",
                "evals cold / warm",
            ],
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "budget": BUDGET,
                "pace": asdict(PACE),
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
