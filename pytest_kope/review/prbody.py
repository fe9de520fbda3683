"""What a reviewer reads on the forge: the pull-request title, body and the comment for a new winner.

Every figure is one this run measured (the verification's paired timing against the committed kernel),
given with its 95% bound; what came from earlier runs (recalled lessons) is labelled as such and
carries no figure.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from ..judge.outcome import Judged
from .report import lineage, seconds


@dataclass
class Evidence:
    """Everything a pull-request body says about one winner, all from this run."""

    operator: str
    toolchain: str
    source: str  # repo-relative path of the kernel
    branch: str
    sha: str
    base: str
    run_id: str
    seed: int
    hardware: dict[str, Any]
    hardware_name: str
    winner: Judged  # the verification's verdict against the committed kernel
    baseline: Judged
    history: list[Judged]
    lessons: list[dict[str, Any]] = field(default_factory=list)
    build: str = ""  # the build command line, or the flags
    flags_in_source: list[str] = field(default_factory=list)  # own builds: "flag: its source form"
    plot: str = ""  # Markdown that shows or links the speedup plot
    note: str = ""  # where the commit went, when not simply on top of the branch
    run_url: str = ""
    remote: str = "origin"
    peers: str = ""  # --kope-peers: the winner next to its best kernel-only peer, measured this run


def headline(e: Evidence) -> tuple[float, float, float]:
    """Geometric means over the performance tests of the paired ratio and its 95% bounds."""
    ts = e.winner.timings

    def gm(xs: list[float]) -> float:
        return math.exp(sum(math.log(max(x, 1e-12)) for x in xs) / len(xs))

    before, after = e.winner.paired_times or (1.0, 1.0)
    return before / after, gm([t.ratio_low for t in ts]), gm([t.ratio_high for t in ts])


def title(e: Evidence) -> str:
    """A pull request's title."""
    ratio, _, _ = headline(e)
    return f"kope({e.operator}): {ratio:.2f}x faster on {e.hardware_name}"


def _timing_table(e: Evidence) -> str:
    rows = [
        (
            f"`{t.test.split('::')[-1]}`",
            seconds(t.reference_s),
            seconds(t.candidate_s),
            f"{t.of_medians:.2f}x",
            f"[{t.ratio_low:.2f}, {t.ratio_high:.2f}]",
            t.rounds,
        )
        for t in e.winner.timings
    ]
    headers = [
        "test",
        "before (committed)",
        "after (winner)",
        "ratio (before / after)",
        "95% bound",
        "rounds",
    ]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _lineage_table(e: Evidence) -> str:
    chain = lineage(e.winner, [e.baseline, *e.history])
    by_hash = {j.candidate.hash: j for j in e.history}
    rows = []
    for step, j in enumerate(chain):
        seen = by_hash.get(j.candidate.hash, j)  # the verdict during the search, not the re-run
        if j is e.baseline or j.candidate.agent == "baseline":
            rows.append((step, "committed", "-", "the committed kernel", "-", "-"))
            continue
        ratio = f"{seen.ratio:.2f}x (low {seen.ratio_low:.2f})" if seen.ratio else "-"
        rows.append(
            (step, f"`{j.candidate.short}`", j.candidate.agent, j.candidate.idea, seen.outcome.value, ratio)
        )
    headers = ["step", "candidate", "agent", "idea", "outcome", "vs its incumbent (median, 95% bound low)"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _tests(e: Evidence) -> list[str]:
    passed = e.winner.tests_passed
    listed = [f"  - `{t}`" for t in passed[:40]] + (
        [f"  - ... and {len(passed) - 40} more"] if len(passed) > 40 else []
    )
    return [
        f"- Correctness tests, in a fresh process with fresh random inputs (seed {e.seed}): "
        f"{len(passed)} passed",
        *listed,
        "- Differential check against the committed kernel (its recorded calls replayed as tested, scaled "
        "x1000 and x0.001, offset, and with more OpenMP threads than cores): passed in the same "
        "verification",
        "- Timed outputs: the winner's outputs on every timed buffer matched the committed kernel's",
    ]


def _lessons(e: Evidence) -> list[str]:
    if not e.lessons:
        return ["None: the experience graph had nothing relevant for this operator on this hardware."]
    lines = ["What the agent was told from earlier runs (carried over, not measured in this run):", ""]
    return lines + [f"- {lesson['text']}" for lesson in e.lessons]


def _toolchain(e: Evidence) -> list[str]:
    params = " ".join(f"`{k}={v}`" for k, v in sorted(e.winner.candidate.params.items()))
    lines = [f"- toolchain: `{e.toolchain}`", f"- parameters: {params or '(none)'}"]
    if e.flags_in_source:
        lines.append("- compiler flags written into the source (the repo builds this kernel itself):")
        lines += [f"  - `{flag}`: {how}" for flag, _, how in (f.partition(": ") for f in e.flags_in_source)]
        lines.append(
            "  - the `default` clone runs where the instruction set is missing; plain pytest passed on it,"
            " built with -march=x86-64 -DKOPE_NO_CLONES"
            if any("target_clones" in f for f in e.flags_in_source)
            else "  - no instruction-set choice: the file runs wherever the committed one did"
        )
    elif e.build:
        lines.append(f"- build: `{e.build}`")
    compilers = e.hardware.get("compilers") or e.hardware.get("compiler")
    if compilers:
        lines.append(f"- compiler: `{json.dumps(compilers, sort_keys=True, default=str)}`")
    return lines


def body(e: Evidence) -> str:
    """A pull request's body: the evidence, measured in this run."""
    ratio, low, high = headline(e)
    rounds = sorted({t.rounds for t in e.winner.timings})
    lines = [
        f"**{ratio:.2f}x** faster than the committed kernel (95% bound [{low:.2f}, {high:.2f}], "
        f"geometric mean over {len(e.winner.timings)} performance test(s)) on {e.hardware_name}, "
        f"measured by pytest-kope run `{e.run_id}` against `{e.base[:10]}`.",
        "",
        f"Kernel: `{e.source}`. Idea: {e.winner.candidate.idea} (agent `{e.winner.candidate.agent}`).",
    ]
    if e.peers:
        lines += ["", f"Next to the peers (informational, not judged): {e.peers}."]
    if e.note:
        lines += ["", f"> {e.note}"]
    lines += [
        "",
        "### Before and after",
        "",
        "Winner and committed kernel timed in one process, interleaved rounds "
        f"({', '.join(map(str, rounds))} per test); the ratio is the median of per-round "
        "committed/winner times and the bound is a distribution-free 95% interval of that median.",
        "",
        _timing_table(e),
        "",
        "### Tests passed",
        "",
        *_tests(e),
        "",
        "### Lineage",
        "",
        "The attempts that led here, each judged against the incumbent of its time during the search:",
        "",
        _lineage_table(e),
        "",
        "### Lessons recalled",
        "",
        *_lessons(e),
        "",
        "### Toolchain and flags",
        "",
        *_toolchain(e),
        "",
        "### Hardware",
        "",
        "```json",
        json.dumps(e.hardware, indent=1, sort_keys=True, default=str),
        "```",
    ]
    if e.plot:
        lines += ["", "### Speedup over evaluations", "", e.plot]
    lines += ["", "### Reproduce", "", *_reproduce(e)]
    footer = f"pytest-kope run `{e.run_id}`" + (
        f" · [CI run and its files]({e.run_url})" if e.run_url else ""
    )
    return "\n".join([*lines, "", f"<sub>{footer}</sub>", ""])


def _reproduce(e: Evidence) -> list[str]:
    return [
        "```bash",
        f"git fetch {e.remote} {e.branch} && git checkout {e.sha[:12]}",
        f"pytest -k {e.operator} --kope-seed {e.seed}                  # the winner under this run's inputs",
        f"git checkout {e.base[:12]} && pytest -k {e.operator} --kope-optimize --kope-seed {e.seed}"
        "   # the search again",
        "```",
    ]


def comment(e: Evidence) -> str:
    """The note added to an open pull request when a later run commits a better winner."""
    ratio, low, high = headline(e)
    return (
        f"New winner `{e.sha[:10]}` from run `{e.run_id}`: **{ratio:.2f}x** faster than the committed "
        f"kernel (95% bound [{low:.2f}, {high:.2f}]) on {e.hardware_name}. {e.winner.candidate.idea}. "
        "The description above now describes it." + (f"\n\n> {e.note}" if e.note else "")
    )
