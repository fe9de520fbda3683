"""What a person reads: the plain-run timing table, the optimize table, report.json and report.md."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from .summary import CandidateEntry, OperatorSummary, Searched, Winner

if TYPE_CHECKING:
    from ..candidate import Candidate
    from ..judge.outcome import Judged
    from ..operator import Operator


def report_schema() -> dict[str, Any]:
    """The JSON schema of report.json (package data: pytest_kope/schemas/report.schema.json)."""
    import json
    from importlib.resources import files

    schema: dict[str, Any] = json.loads(
        files("pytest_kope").joinpath("schemas/report.schema.json").read_text()
    )
    return schema


def seconds(s: float | None) -> str:
    """A duration for people: 12.3 us, 4.5 ms, 1.2 s."""
    if s is None:
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def bench_table(records: list[Any]) -> str:
    """The timings table of a plain run."""
    rows = [
        (
            r.test,
            seconds(r.stats.median),
            f"±{seconds(r.stats.iqr / 2)}",
            r.stats.rounds,
            r.stats.iterations,
            f"{r.bytes_moved / r.stats.median / 1e9:.1f}" if r.bytes_moved else "-",
        )
        for r in records
    ]
    return tabulate(rows, headers=["test", "median", "IQR/2", "rounds", "calls/round", "GB/s"])


def lineage(best: Judged, history: list[Judged]) -> list[Judged]:
    """`best` and its ancestors in `history`, oldest first (parents followed once each)."""
    by_hash = {j.candidate.hash: j for j in history}
    chain, seen = [best], {best.candidate.hash}
    while chain[-1].candidate.parent in by_hash and chain[-1].candidate.parent not in seen:
        seen.add(chain[-1].candidate.parent)
        chain.append(by_hash[chain[-1].candidate.parent])
    return list(reversed(chain))


def operator_summary(
    *,
    op: Operator,
    search: Searched,
    verified: Judged | None,
    winner: Winner,
    note: str,
    seconds_spent: float,
    **rest: Any,
) -> OperatorSummary:
    """One operator's entry in report.json: its full account, on the verified winner when there is one
    (`verified`), else on the search's incumbent; `rest`: the other fields, as the session decided them."""
    best = verified if verified is not None else search.incumbent
    baseline_s = search.baseline.time_s
    improved = best is not search.baseline and bool(best.timings)
    best_s = best.time_s if improved else baseline_s
    if verified is not None and improved and best.paired_times:  # one measurement: the verification's
        baseline_s, best_s = best.paired_times  # paired rounds
    return OperatorSummary(
        name=op.name,
        verified=verified is not None,
        baseline_judged=True,
        family=op.family,
        toolchain=op.toolchain,
        source=str(op.source),
        baseline_s=baseline_s,
        best_s=best_s,
        speedup=(best.speedup or 1.0) if improved else 1.0,
        evaluations=search.evaluations,
        evaluations_to_best=search.evaluations_to_best,
        winner=winner,
        best={"id": best.candidate.hash, "idea": best.candidate.idea, "params": best.candidate.params},
        note=note,
        seconds=round(seconds_spent, 1),
        outcomes=_count(j.outcome.value for j in search.history),
        candidates=[_entry(j) for j in search.history],
        **rest,
    )


def _entry(j: Judged) -> CandidateEntry:
    return {
        "id": j.candidate.hash,
        "agent": j.candidate.agent,
        "idea": j.candidate.idea,
        "params": j.candidate.params,
        "parent": j.candidate.parent,
        "outcome": j.outcome.value,
        "reason": j.reason[:500],
        "ratio": j.ratio,
        "ratio_low": j.ratio_low,
        "speedup": j.speedup,
        "time_s": j.time_s,
        "failures": [f[:500] for f in j.failures[:3]],
        "notes": j.notes[:3],
        "bar": j.bar,
    }


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


FINAL_HEADERS = [
    "operator",
    "baseline",
    "best",
    "speedup",
    "evaluations",
    "to best",
    "verified",
    "stopped",
    "wall",
    "branch",
]


def stop_text(o: OperatorSummary) -> str:
    """Why an operator's search ended, in a few words ('no gain in 8', 'converged', 'error')."""
    return str((o.stopped or {}).get("short", "error" if o.error is not None else "-"))


def _wall(o: OperatorSummary) -> str:
    """An operator's wall time, its verification included."""
    return f"{o.seconds:.0f} s" if o.seconds is not None else "-"


def final_table(operators: list[OperatorSummary], fmt: str = "simple") -> str:
    """The table of operators at the end of an optimize run."""
    rows: list[tuple[Any, ...]] = []
    for o in operators:
        if not o.baseline_judged:  # stopped on an error, or not reached within the time budget
            detail = f"error: {o.error[:60]}" if o.error is not None else "-"
            rows.append((o.name, "-", "-", "-", "-", "-", "no", stop_text(o), _wall(o), detail))
            continue
        rows.append(
            (
                o.name,
                seconds(o.baseline_s),
                seconds(o.best_s),
                f"{o.speedup:.2f}x",
                o.evaluations,
                o.evaluations_to_best,
                "yes" if o.verified else "no",
                stop_text(o),
                _wall(o),
                o.winner.branch or "-",
            )
        )
    return tabulate(rows, headers=FINAL_HEADERS, tablefmt=fmt)


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _ratio(x: float) -> str:
    return f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


def closing_parts(operators: list[OperatorSummary]) -> list[str]:
    """The parts of pytest's last line after an optimize run:
    ['kope: 8 operators', '6 verified winners (3.4x-66x)', '1 without a winner', '1 stopped']."""
    winners = [
        o.speedup
        for o in operators
        if o.verified and not o.winner.already_committed and o.speedup is not None
    ]
    again = sum(bool(o.verified and o.winner.already_committed) for o in operators)
    errors = sum(o.error is not None for o in operators)
    failed = sum(o.search_failed is not None for o in operators)
    unreached = sum((o.stopped or {}).get("reason") == "not_reached" for o in operators)
    interrupted = sum(_was_interrupted(o) for o in operators)
    plain = len(operators) - len(winners) - again - errors - unreached - interrupted
    span = ""
    if winners:
        lo, hi = min(winners), max(winners)
        span = f" ({_ratio(lo)})" if _ratio(lo) == _ratio(hi) else f" ({_ratio(lo)}-{_ratio(hi)})"
    parts = [
        "kope: " + _plural(len(operators), "operator", "operators"),
        _plural(len(winners), "verified winner", "verified winners") + span,
    ]
    if again:
        parts.append(f"{again} earlier winner{'s' if again > 1 else ''} verified again (already committed)")
    if plain:
        parts.append(f"{plain} without a winner")
    parts.append(f"{errors} stopped")
    if failed:
        parts.append(f"{failed} search{'es' if failed > 1 else ''} failed (see above)")
    if unreached:
        parts.append(f"{unreached} not reached (time budget)")
    if interrupted:
        parts.append(f"{interrupted} interrupted")
    return parts


def _was_interrupted(o: OperatorSummary) -> bool:
    return (o.stopped or {}).get("reason") == "interrupted"


def install_closing_line(terminalreporter: Any, operators: list[OperatorSummary]) -> None:
    """Make pytest's last line say what the optimize run did instead of 'no tests ran'. The terminal
    reporter builds that line from its public build_summary_stats_line(); this wraps it, keeping any
    part pytest adds (warnings, deselected) and colouring the line red when an operator stopped."""
    tr, parts = terminalreporter, closing_parts(operators)
    original = tr.build_summary_stats_line

    def build() -> tuple[list[tuple[str, dict[str, bool]]], str]:
        theirs, _ = original()
        theirs = [p for p in theirs if p[0] != "no tests ran"]
        color = "red" if any(o.error is not None or _was_interrupted(o) for o in operators) else "green"
        color = "yellow" if color == "green" and "warnings" in tr.stats else color
        return [(text, {color: True, "bold": i == 0}) for i, text in enumerate(parts)] + theirs, color

    tr.build_summary_stats_line = build


def review_lines(operators: list[OperatorSummary]) -> list[str]:
    """report.md's section on what reviewers get: pushes, pull requests, and each speedup plot."""
    lines: list[str] = []
    for o in operators:
        said = []  # where the commit went and the push are in the operator's note above
        pr = o.published.pull_request
        if pr:
            said.append(
                f"pull request [#{pr['number']}]({pr['url']}) {'opened' if pr['created'] else 'updated'}"
            )
        if o.published.review_error:
            said.append(f"pull request not opened: {o.published.review_error}")
        if said:
            lines.append(f"- **{o.name}**: " + "; ".join(said))
    plots = [o for o in operators if o.published.plot]
    if lines:
        lines = ["", "## Review", "", *lines]
    if plots:
        lines += ["", "## Speedup over evaluations", ""]
        lines += [f"![{o.name}: speedup over evaluations]({o.published.plot})" for o in plots]
    return lines


def flags_in_source(op: Operator, candidate: Candidate) -> list[str]:
    """How a winner's `flags` went into its source, where the repo builds the kernel itself (else [])."""
    from ..toolchains.flagblock import describe

    return describe(op.build_context(op.spec), str(candidate.params.get("flags", "")))


def _portability(op: Operator, candidate: Candidate) -> list[str]:
    """The commit's lines on where the winner runs: its flags in the source (the repo builds it), or
    a warning that -march=native ties pytest-kope's build to CPUs like this one."""
    in_source = flags_in_source(op, candidate)
    if in_source:
        lines = [
            "Compiler flags written into the source, in its marked block (the repo's own build reads them):"
        ]
        return [*lines, *(f"- {line}" for line in in_source), ""]
    native = [f for f in str(candidate.params.get("flags", "")).split() if f.endswith("=native")]
    if not native:
        return []
    return [
        f"Built with {' '.join(native)}: the code is tied to CPUs like this one; set kope_c_target_flags"
        " (e.g. -march=x86-64-v3) to search code for the machines it will run on.",
        "",
    ]


def commit_message(
    op: Operator, winner: Judged, baseline: Judged, history: list[Judged], run_id: str, hardware: str
) -> str:
    """Subject, table, tests, idea, lineage and trailers, as DESIGN.md fixes them."""
    speedup = winner.speedup or winner.ratio or 1.0
    rows = [
        (
            t.test.split("::")[-1],
            seconds(t.reference_s),
            seconds(t.candidate_s),
            f"{t.of_medians:.2f}x [{t.ratio_low:.2f}, {t.ratio_high:.2f}]",
        )
        for t in winner.timings
    ]
    chain = " -> ".join(
        f"{j.candidate.short} ({j.candidate.idea})" if j is not baseline else "baseline"
        for j in lineage(winner, [baseline, *history])
    )
    params = " ".join(f"{k}={v}" for k, v in sorted(winner.candidate.params.items()))
    tests = tests_by_file(winner.tests_passed, winner.fixed_inputs) or "- (none recorded)"
    portable = _portability(op, winner.candidate)
    return "\n".join(
        [
            f"kope({op.name}): {speedup:.2f}x faster on {hardware}",
            "",
            f"Idea: {winner.candidate.idea} (agent {winner.candidate.agent}).",
            "",
            "Paired timing against the committed kernel in the verification's interleaved rounds: median"
            " times, their ratio [95% bound of the per-round ratio]:",
            "",
            tabulate(rows, headers=["test", "baseline", "winner", "ratio"], tablefmt="github"),
            "",
            f"Correctness tests passed in a fresh process ({len(winner.tests_passed)}), with fresh random "
            "inputs unless marked:",
            tests,
            "",
            "Differential check: the winner matched the committed kernel on the tests' calls, scaled x1000,",
            "x0.001 and offset, repeated with more threads than cores, and on calls drawn beyond the",
            "tests' sizes and magnitudes. The operator's tests passed under plain pytest on this file.",
            "",
            *portable,
            f"Parameters: {params or '(none)'}",
            f"Lineage: {chain}",
            "",
            f"Kope-Run: {run_id}",
            f"Kope-Speedup: {speedup:.2f}",
            f"Kope-Hardware: {hardware}",
            f"Kope-Candidate: {winner.candidate.hash}",
            "",
        ]
    )


def tests_by_file(tests: list[str], fixed_inputs: list[str]) -> str:
    """One line per test file: how many of its tests passed, and how many made their own inputs."""
    files: dict[str, list[str]] = {}
    for t in tests:
        files.setdefault(t.split("::")[0], []).append(t)
    fixed = set(fixed_inputs)
    lines = []
    for path, ids in files.items():
        own = sum(t in fixed for t in ids)
        lines.append(
            f"- {path}: {len(ids)} passed" + (f" ({own} with their own fixed inputs)" if own else "")
        )
    return "\n".join(lines)
