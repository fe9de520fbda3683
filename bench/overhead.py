"""Where an attempt's time goes: the judge before this change (a fresh `pytest` child per judgement,
each building its own kernels, fixed timing rounds) against after (one build per candidate, children
forked from warm fork servers, timing rounds that stop once the 95% bound decides, each perf test's
inputs made once per server), in one run, side by side on the sample operators; plus "after, body per
child" (the same, but every timing child runs the perf test's body, as before `perfinputs`); plus the
A/A false-win rate of the timing decision.

    python bench/overhead.py                      # all 8 sample operators, 6 attempts each per judge
    python bench/overhead.py --ops softmax,sgemm --attempts 4 --aa 0   # JSON: bench/results/overhead.json
    python bench/overhead.py --modes after --attempts 1 --aa 1 --ops rowsum   # the smallest run

Per attempt (one candidate: correctness, then, if correct, timing against the best so far, with a
second look for an undecided gain, as the optimize loop does) the
seconds are split into: build (compile; the build step or the child's own build), start (process
start or fork, collection, exit), correctness (the judge's part of the correctness run: pytest's
protocol, the guards around every kernel call, the differential replay and compare), sanitized (a
passing candidate's child built with -fsanitize=address,undefined, its build included), tests (the
operator's own test code in it: making inputs, computing references, asserting), timing (the paired
timing's protocol: inputs, poisoning, output checks), kernel (inside timed windows), verification
(the winner's fresh re-run, once per operator, spread over a 24-attempt budget; its own compiles and
timed calls count as build and kernel) and bookkeeping (graph writes and lesson distillation).
Overhead is all of it but build and kernel (the issue's measure); harness is overhead less the
operator's own test code, which the judge runs but cannot make faster.

A/A (`false_wins.py`): the committed kernel against a copy of itself (same code, another candidate),
timed by the judge as a candidate is, with the session's rule (`session.decide.time_and_decide`): a
false win is a verdict `better` (bound above 1, median above 1.05), after the second look an undecided
gain gets. `--aa` independent pairs in all (each its own judge, fork servers, inputs and twin build,
the operators in turn), the rate given with its exact Clopper-Pearson 95% interval.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import false_wins  # noqa: E402
from pytest_kope.candidate import Candidate  # noqa: E402
from pytest_kope.judge.controller import isolation  # noqa: E402
from pytest_kope.judge.controller.plan import Plan  # noqa: E402
from pytest_kope.judge.controller.runner import Judge  # noqa: E402
from pytest_kope.judge.outcome import Judged  # noqa: E402
from pytest_kope.memory import distill  # noqa: E402
from pytest_kope.memory.graph import Graph  # noqa: E402
from pytest_kope.operator import is_performance_test, operator_of  # noqa: E402
from pytest_kope.session.decide import time_and_decide  # noqa: E402
from pytest_kope.toolchains.base import judging_env  # noqa: E402
from pytest_kope.toolchains.c import CToolchain  # noqa: E402

PHASES = [
    "build",
    "start",
    "correctness",
    "sanitized",
    "tests",
    "timing",
    "kernel",
    "verification",
    "bookkeeping",
]
MODES = {
    "before": {"fork_server": False, "sequential": False, "record_inputs": False},
    "after, body per child": {"fork_server": True, "sequential": True, "record_inputs": False},
    "after": {"fork_server": True, "sequential": True, "record_inputs": True},
}


class Collect:
    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)


def plans(repo: Path, names: list[str] | None) -> list[Plan]:
    """One plan per operator of `repo`, as the optimize run makes them."""
    collect = Collect()
    pytest.main(
        [
            "--collect-only",
            "-qq",
            "--assert=plain",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(repo),
            str(repo),
        ],
        [collect],
    )
    by_op: dict[str, list[pytest.Item]] = {}
    for item in collect.items:
        op = operator_of(item)
        if op is not None and (not names or op.name in names):
            by_op.setdefault(op.name, []).append(item)
    tc = CToolchain()
    out = []
    for items in by_op.values():
        op = operator_of(items[0])
        assert op is not None  # every item in by_op has an operator
        correctness = [i.nodeid for i in items if not is_performance_test(i)]
        performance = [i.nodeid for i in items if is_performance_test(i)]
        files = sorted({Path(str(i.path)) for i in items})
        out.append(
            Plan(
                operator=op,
                rootdir=repo,
                inifile=repo / "pytest.ini",
                files=files,
                correctness=correctness,
                performance=performance,
                toolchain_env=judging_env(tc),
                sanitize_env=tc.sanitize_env,  # as a run's plan: passing candidates are judged sanitized too
            )
        )
    return out


def candidates(plan: Plan, n: int, seed: int) -> list[Candidate]:
    """`n` points of the operator's declared tuning space, as the tuner would propose them."""
    op = plan.operator
    base = op.baseline()
    points = [p for p in op.spec.space.points() if p != base.params]
    random.Random(seed).shuffle(points)
    return [
        Candidate(
            op.text, op.source.name, op.toolchain, params=p, idea="bench", agent="tuner", parent=base.hash
        )
        for p in points[:n]
    ]


def bookkeeping(graph: Graph, task: int, run_id: str, judged: list[Judged]) -> float:
    began = time.monotonic()
    for j in judged:
        graph.record(task, run_id, j)
    distill(graph, task, run_id)
    return time.monotonic() - began


def attempt_row(j: Judged) -> dict[str, float]:
    row = {p: 0.0 for p in PHASES}
    for phase, seconds in j.phases.items():
        phase = "correctness" if phase == "compare" else phase
        row[phase] = row.get(phase, 0.0) + seconds
    return row


def judge_operator(
    plan: Plan,
    mode: str,
    attempts: list[Candidate],
    graph: Graph,
    ceilings: dict[str, Any] | None,
    budget: int,
) -> dict[str, Any]:
    """Baseline, attempts in batches (correctness in parallel, then timing), one verification."""
    plan = dataclasses.replace(plan.with_settings(**MODES[mode]), ceilings=ceilings)
    tc = CToolchain()
    judge = Judge(plan, tc.screen)
    task = graph.task_id(plan.operator.name, plan.operator.family, "c", tc.fingerprint())
    run_id = f"bench-{mode}-{plan.operator.name}-{time.time_ns()}"
    graph.start_run(run_id, "bench", tc.fingerprint())
    began = time.monotonic()
    rows, rounds, correct = [], [], []
    try:
        base = judge.baseline(plan.operator.baseline())
        judge.performance(base, base.candidate)
        incumbent = base
        for k in range(0, len(attempts), plan.jobs):
            batch = judge.correctness(attempts[k : k + plan.jobs])
            for j in batch:
                if j.outcome.correct:  # timed against the best so far, as the loop does (`judge_batch`)
                    if time_and_decide(judge, j, incumbent, plan.settings.min_gain, lambda _: None):
                        incumbent = j
                    rounds += [t.rounds for t in j.timings]
                    correct.append(j.candidate)
            spent = bookkeeping(graph, task, run_id, batch)
            for j in batch:
                rows.append({**attempt_row(j), "bookkeeping": spent / len(batch)})
        verify = time.monotonic()
        winner = incumbent.candidate if incumbent is not base else (correct or attempts)[0]
        fresh = [judge.baseline(base.candidate)]  # as `session.verify.verify`: recorded in a warm child,
        judge.fresh_processes()  # then the winner in fresh processes
        fresh.append(judge.correctness([winner])[0])
        if fresh[1].outcome.correct:
            judge.performance(fresh[1], base.candidate)
        verify = time.monotonic() - verify
    finally:
        judge.close()
    # one verification per operator, spread over a run's budget of attempts; its compiles and timed
    # calls count as build and kernel, as everywhere else, and the rest as verification
    share = 1 / max(1, budget, len(rows))
    own = {p: sum(j.phases.get(p, 0.0) for j in fresh) for p in ("build", "kernel")}
    for row in rows:
        row["verification"] = (verify - own["build"] - own["kernel"]) * share
        row["build"] += own["build"] * share
        row["kernel"] += own["kernel"] * share
    return {"rows": rows, "wall": time.monotonic() - began, "rounds": rounds, "notes": judge.notes}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summarize(results: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    table = []
    for mode, ops in results.items():
        rows = [r for op in ops for r in op["rows"]]
        total = [sum(r[p] for p in PHASES) for r in rows]
        overhead = [t - r["build"] - r["kernel"] for t, r in zip(total, rows)]
        harness = [o - r["tests"] for o, r in zip(overhead, rows)]
        rounds = [x for op in ops for x in op["rounds"]]
        table.append(
            [
                mode,
                len(rows),
                *(median([r[p] for r in rows]) for p in PHASES),
                median(total),
                median(overhead),
                median(harness),
            ]
            + [median(rounds), sum(op["wall"] for op in ops)]
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "sample_ops")
    parser.add_argument("--ops", default="", help="comma-separated operators (default: all)")
    parser.add_argument("--attempts", type=int, default=6, help="candidates judged per operator and mode")
    parser.add_argument(
        "--aa", type=int, default=200, help="independent A/A pairs in all, operators in turn (0: none)"
    )
    parser.add_argument(
        "--aa-minutes", type=float, default=0.0, help="start no A/A pair after this long (0: no limit)"
    )
    parser.add_argument(
        "--aa-verify",
        action="store_true",
        help="every A/A twin also goes through a winner's verification, crowned or not (about 15 s more a pair)",
    )
    parser.add_argument(
        "--budget", type=int, default=24, help="attempts per operator a verification is spread over"
    )
    parser.add_argument("--modes", default="", help="comma-separated judges to run (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "overhead.json")
    args = parser.parse_args(argv)
    from pytest_kope.judge.measure.physics import ceilings_for

    work = Path(tempfile.mkdtemp(prefix="kope-bench-"))
    graph = Graph(work / "experience.db")
    tc = CToolchain()
    ceilings = ceilings_for(graph, tc.fingerprint(), work / "builds").to_json()
    print("isolation:", "; ".join(isolation.isolation_summary()))
    modes = [m for m in MODES if not args.modes or m in args.modes.split(",")]
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    chosen = plans(args.repo, [n for n in args.ops.split(",") if n])
    for plan in chosen:
        attempts = candidates(plan, args.attempts, args.seed)
        for mode in modes if plan.operator.name < "m" else reversed(modes):  # alternate who goes first
            result = judge_operator(plan, mode, attempts, graph, ceilings, args.budget)
            results[mode].append({"operator": plan.operator.name, **result})
            print(
                f"{plan.operator.name:10} {mode:6} {len(result['rows'])} attempts in {result['wall']:.1f} s"
            )
            if MODES[mode]["fork_server"] and (
                off := [n for n in result["notes"] if "fork servers off" in n]
            ):
                # e.g. an editable install pointing at another checkout: the children cannot import us
                print(f"  WARNING: this judge ran without fork servers: {off[0].splitlines()[0][:300]}")
    headers = ["judge", "attempts", *PHASES, "total", "overhead", "harness", "rounds", "wall s"]
    print("\nper attempt, median seconds (overhead: all but build and kernel; harness: overhead less tests)")
    print(tabulate(summarize(results), headers=headers, floatfmt=".3f"))
    aa = (
        false_wins.aa_pairs(chosen, args.aa, minutes=args.aa_minutes, verify_too=args.aa_verify)
        if args.aa and chosen
        else []
    )
    aa_summary = false_wins.summary(aa)
    if args.aa:
        print("\n" + false_wins.line(aa_summary))
        if aa:
            print(
                f"A/A median ratio {median([p['ratio'] for p in aa]):.3f}, "
                f"median rounds {median([p['rounds'] for p in aa])}"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"results": results, "aa": aa, "aa_summary": aa_summary, "phases": PHASES}, indent=1, default=str
        )
    )
    print(f"\nwrote {args.json}")
    graph.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
