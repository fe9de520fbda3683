"""report.md: the run for people. A summary, the results table, what the agent cost, and one section
per operator (before and after, outcomes, why the search stopped, the lessons that mattered). No raw
JSON: report.json beside it keeps everything."""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from .report import closing_parts, final_table, review_lines, seconds, stop_text
from .summary import OperatorSummary, Peers

USAGE_HEADERS = ["agent", "calls", "tokens in", "tokens out", "cached", "retries", "faults"]


def duration(s: float | None) -> str:
    """11m52s, 3m05s, 42s."""
    if s is None:
        return "-"
    m, sec = divmod(round(s), 60)
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def _count(value: Any) -> int:
    return len(value) if isinstance(value, (list, tuple)) else int(value or 0)


def usage_table(agent: str, usage: dict[str, Any]) -> str:
    """One row for the agent (with its provider, for an LLM) and one per operator it spent tokens on:
    calls, tokens in/out/cached, retries and faults ('-' where the provider reports none)."""
    label = f"{agent} ({usage['provider']})" if usage.get("provider") else agent
    rows = [[label, *_token_cells(usage), _count(usage.get("retries")), _count(usage.get("faults"))]]
    for op, per in sorted((usage.get("per_operator") or {}).items()):
        if isinstance(per, dict):
            rows.append([f"{agent}: {op}", *_token_cells(per), "", ""])
    return tabulate(rows, headers=USAGE_HEADERS, tablefmt="github")


def _token_cells(usage: dict[str, Any]) -> list[str]:
    """calls, tokens in, tokens out, cached: input excludes what a cache served."""

    def cell(key: str) -> str:
        return f"{usage[key]:,}" if isinstance(usage.get(key), int) else "-"

    cached = "-"
    if any(k in usage for k in ("cache_read_input_tokens", "cache_creation_input_tokens")):
        cached = f"{usage.get('cache_read_input_tokens', 0):,}"
    return [cell("calls"), cell("input_tokens"), cell("output_tokens"), cached]


def _usage_section(data: dict[str, Any]) -> list[str]:
    usage = data.get("usage") or {}
    lines = ["## Agent usage", "", usage_table(str(data.get("agent", "?")), usage), ""]
    extra = {
        k: v
        for k, v in usage.items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and k not in ("calls",)
        and not k.endswith("_tokens")
    }
    if extra:
        lines += [", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(extra.items())), ""]
    for title, key in (("Faults", "faults"), ("Retries", "retries"), ("Notes", "notes")):
        items = usage.get(key)
        if isinstance(items, list) and items:
            lines += [f"{title}:", "", *(f"- {str(i)[:300]}" for i in items[:20]), ""]
    if usage.get("model"):
        lines += [f"Model: {usage['model']}", ""]
    return lines + _records(usage.get("records"))


def _records(records: Any) -> list[str]:
    """What the model was told and said, kept in the run's folder: one line per operator, naming
    each file (a prompt, a resend, a request with its reply or error)."""
    if not isinstance(records, list) or not records:
        return []
    by_op: dict[str, list[str]] = {}
    for r in map(str, records):
        folder, _, name = r.rpartition("/")
        by_op.setdefault(folder, []).append(name.removesuffix(".json"))
    lines = ["Model transcripts (in this run's folder, each as .json and .txt):", ""]
    lines += [f"- `{folder}/`: {', '.join(names)}" for folder, names in by_op.items()]
    return [*lines, ""]


def _outcomes(o: OperatorSummary) -> str:
    counts = o.outcomes or {}
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def _before_after(o: OperatorSummary) -> str:
    before, after = seconds(o.baseline_s), seconds(o.best_s)
    speedup = o.speedup if o.speedup is not None else 1.0
    if o.verified:
        head = f"{before} -> {after}: {speedup:.2f}x faster, verified in a fresh process"
        commit = o.winner.commit
        where = f", committed {commit[:10]} to `{o.winner.branch}`" if commit else ""
        return head + where + "."
    if speedup > 1.0:
        return f"{before} -> {after} ({speedup:.2f}x), not verified: nothing committed."
    return f"{before}: no faster kernel found; nothing committed."


def _peer_line(name: str, peers: Peers) -> str:
    """--kope-peers' headline for one operator, or why there is none."""
    return str(peers.get("headline") or f"{name}: no peer comparison ({peers.get('error', 'none')})")


def operator_section(
    o: OperatorSummary, lessons: list[dict[str, Any]], budget: int | None = None
) -> list[str]:
    """report.md's section on one operator."""
    lines = [f"## {o.name}", ""]
    why = (o.stopped or {}).get("detail") or stop_text(o)
    if not o.baseline_judged:
        what = f"Stopped on an error: {o.error}" if o.error is not None else f"Not optimized: {why}."
        return lines + [what, ""]
    of = f" of {budget}" if budget else ""
    lines += [
        _before_after(o),
        "",
        f"- Evaluations: {o.evaluations}{of}, best found at evaluation {o.evaluations_to_best}"
        f" ({duration(o.seconds)})",
        f"- Outcomes: {_outcomes(o)}",
        f"- Why the search stopped: {why}",
    ]
    if axes := o.exploration:
        lines.append(f"- Axes: {_axes_line(axes)}")
    if busy := o.machine_busy:
        lines.append(
            f"- How busy the machine was: others used {busy['median']:.0%} of it during the median"
            f" timing, {busy['max']:.0%} at most ({busy['timings']} timings)"
        )
    best = o.best
    if best and best.get("idea") and (o.speedup if o.speedup is not None else 1.0) > 1.0:
        params = " ".join(f"{k}={v}" for k, v in sorted((best.get("params") or {}).items()))
        lines.append(f"- Winner: {best['idea']}" + (f" (`{params}`)" if params else ""))
    if o.flags_in_source:
        lines.append(
            f"- Compiler flags written into the source (the repo builds it): {'; '.join(o.flags_in_source)}"
        )
    if held := o.baseline_isa:
        failed = held.get("failed") or []
        outcome = (
            f"{len(failed)} failed: {', '.join(failed[:5])}" if failed else f"{held.get('passed')} passed"
        )
        lines.append(
            "- Plain pytest with the instruction set held to the baseline (-march=x86-64, -DKOPE_NO_CLONES: "
            f"the fallback a machine without it runs): {outcome}"
        )
    if o.published.peers:
        lines.append(f"- Next to the peers: {_peer_line(o.name, o.published.peers)}")
    if o.note and not (o.winner.commit and o.note.startswith("committed")):
        lines.append(f"- Note: {o.note}")
    if lessons:
        lines += ["", "Lessons that mattered:", ""]
        lines += [f"- {lesson['text']} (value {lesson['value']:.2f})" for lesson in lessons]
    return lines + [""]


def markdown(data: dict[str, Any]) -> str:
    """report.md: the run for people, from report.json's data (its operators read back typed)."""
    operators = [OperatorSummary.from_json(o) for o in data.get("operators", [])]
    time_budget = data.get("time_budget_minutes")
    search = (
        f"budget {data['budget']} evaluations per operator, patience {data.get('patience', '-')}, "
        f"exploration rate {data.get('explore_rate', '-')}"
        + (f", time budget {time_budget:g} min" if time_budget is not None else "")
    )
    lines = [
        f"# pytest-kope run {data['run_id']}",
        "",
        f"- Hardware: {data.get('hardware_name', '') or 'unknown'}",
        f"- Agent: {data['agent']}; {search}",
        f"- Wall time: {duration(data.get('seconds'))}",
        f"- Outcome: {', '.join(closing_parts(operators))}",
        "",
        final_table(operators, fmt="github"),
        "",
    ]
    peers = [(o.name, o.published.peers) for o in operators if o.published.peers]
    if peers:  # --kope-peers
        lines += [
            "Next to the kernel-only peers (measured after verification; informational, not judged):",
            "",
        ]
        lines += [f"- {_peer_line(name, p)}" for name, p in peers]
        lines.append("")
    review = review_lines(operators)  # pushes, pull requests, speedup plots
    lines += [*review[1:], ""] if review else []
    lines += _usage_section(data)
    lessons = data.get("lessons") or {}
    for o in operators:
        lines += operator_section(o, lessons.get(o.name, []), data.get("budget"))
    return "\n".join(lines).rstrip() + "\n"


def _axes_line(axes: dict[str, list[str]]) -> str:
    """Which axes the graph knew, which the search tried around its incumbent, which it never did."""
    said = [
        f"{what} {', '.join(f'`{a}`' for a in axes.get(key, []))}"
        for key, what in (
            ("known", "known from the graph"),
            ("explored", "explored around the best point"),
            ("untried", "never explored around it (the search ended first)"),
        )
        if axes.get(key)
    ]
    return "; ".join(said) or "none to tune"
