"""report.md is for people, report.json keeps everything and matches its shipped schema, and pytest's
last line says what the run did."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.judge.outcome import Judged, Outcome, Timing
from pytest_kope.operator import Operator
from pytest_kope.review import report
from pytest_kope.review.report_md import markdown
from pytest_kope.review.summary import OperatorSummary, Searched, Winner
from pytest_kope.stopping import Stop, stopped

SRC = "// kope: param VEC = 0 | 8\nvoid f(const float *x, float *y, int n) {}\n"


def judged(params, outcome, speedup=None, parent=None, agent="tuner") -> Judged:
    idea = "tune " + " ".join(f"{k}={v}" for k, v in params.items())
    cand = Candidate(SRC, "f.c", "c", dict(params), idea, agent, parent)
    timings = (
        [Timing("t::test_perf", 1e-3, 1e-3 / speedup, speedup, speedup * 0.9, speedup, 9)] if speedup else []
    )
    return Judged(cand, outcome, timings=timings, speedup=speedup)


def run_data(tmp_path: Path) -> dict[str, Any]:
    op = Operator(name="f", family="elementwise", toolchain="c", source=tmp_path / "f.c")
    base = judged({"VEC": 0}, Outcome.OK, 1.0, agent="baseline")
    win = judged({"VEC": 8}, Outcome.BETTER, 3.0, parent=base.candidate.hash)
    broken = judged({"VEC": 16}, Outcome.INCORRECT, parent=base.candidate.hash)
    summary = report.operator_summary(
        op=op,
        search=Searched(base, win, [win, broken], 2, 1),
        verified=win,
        winner=Winner("kope/f", "abc1234def"),
        note="committed abc1234def",
        seconds_spent=12.0,
    ).to_json()
    summary["stopped"] = stopped(Stop.NO_GAIN, "no gain in the last 8 evaluations", 8)
    failed = "the committed kernel g.c fails"
    error = {"name": "g", "error": failed, "verified": False, "stopped": stopped(Stop.ERROR, failed)}
    late = {"name": "h", "verified": False, "stopped": stopped(Stop.NOT_REACHED, "time budget ran out")}
    lesson = {"text": "VEC=8: 3.00x on f", "kind": "param", "key": "VEC=8", "value": 0.67, "uses": 1}
    return {
        "run_id": "20261130-120000-abcdef",
        "hardware": {
            "arch": "x86_64",
            "model": "AMD EPYC",
            "simd": ["avx2"],
            "simd_level": "avx2",
            "cores": 2,
        },
        "hardware_name": "AMD EPYC (x86_64, avx2, 2 cores)",
        "agent": "claude",
        "budget": 24,
        "patience": 8,
        "explore_rate": 0.1,
        "time_budget_minutes": 3.0,
        "seconds": 712.0,
        "availability": {"c": {"available": True, "reason": "gcc 12"}},
        "isolation": ["bubblewrap: no network"],
        "usage": {
            "calls": 7,
            "input_tokens": 12000,
            "output_tokens": 3400,
            "cache_read_input_tokens": 9000,
            "cache_creation_input_tokens": 1000,
            "faults": ["f: HTTP 529 overloaded"],
            "retries": ["f: HTTP 429, retried in 2.0 s"],
            "notes": [],
            "per_operator": {"f": {"calls": 7}},
            "model": "claude-sonnet-4-5",
        },
        "operators": [summary, error, late],
        "lessons": {"f": [{**lesson, "effect": 3.0, "losing": False}], "g": [], "h": []},
    }


def test_report_json_matches_the_shipped_schema_and_the_schema_bites(tmp_path: Path) -> None:
    schema = report.report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = json.loads(json.dumps(run_data(tmp_path), default=str))
    jsonschema.validate(data, schema)
    for breakage in (
        lambda d: d["operators"][0].pop("stopped"),
        lambda d: d["operators"][0].pop("candidates"),  # an optimized operator keeps its full account
        lambda d: d["operators"][0]["stopped"].update(reason="tired"),
        lambda d: d["operators"][0]["candidates"][0].update(outcome="great"),
        lambda d: d["operators"][1].update(verified=True),  # an operator that stopped on an error
        lambda d: d.pop("usage"),
    ):
        broken = copy.deepcopy(data)
        breakage(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


def test_report_md_is_for_people(tmp_path: Path) -> None:
    md = markdown(run_data(tmp_path))
    assert "{" not in md and "```" not in md  # no raw JSON
    assert "- Outcome: kope: 3 operators, 1 verified winner (3.0x), 1 stopped, 1 not reached" in md
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if "| claude" in line]
    assert rows == [
        ["claude", "7", "12,000", "3,400", "9,000", "1", "1"],
        ["claude: f", "7", "-", "-", "-", "", ""],  # one row per operator: --kope-max-tokens is per operator
    ]
    header = next(line for line in md.splitlines() if line.startswith("| agent"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "agent",
        "calls",
        "tokens in",
        "tokens out",
        "cached",
        "retries",
        "faults",
    ]
    assert "- f: HTTP 529 overloaded" in md
    section = md.split("## f\n")[1].split("## g\n")[0]
    assert (
        "1 ms -> 333 us: 3.00x faster, verified in a fresh process, committed abc1234def to `kope/f`."
        in section
    )
    assert "- Evaluations: 2 of 24, best found at evaluation 1 (12s)" in section
    assert "- Outcomes: 1 better, 1 incorrect" in section
    assert "- Why the search stopped: no gain in the last 8 evaluations" in section
    assert "- VEC=8: 3.00x on f (value 0.67)" in section
    assert "Stopped on an error: the committed kernel g.c fails" in md
    assert "Not optimized: time budget ran out." in md
    table = md.split("## Agent usage")[0]
    stops = [line.split("|")[8].strip() for line in table.splitlines() if line.startswith("| ")][1:]
    assert stops == ["no gain in 8", "error", "not reached"]


@pytest.mark.parametrize(
    "speedups, errors, unreached, parts",
    [
        ([3.4, 66.0, 12.0], 0, 0, ["kope: 3 operators", "3 verified winners (3.4x-66x)", "0 stopped"]),
        ([2.1], 1, 0, ["kope: 2 operators", "1 verified winner (2.1x)", "1 stopped"]),
        (
            [],
            0,
            2,
            [
                "kope: 3 operators",
                "0 verified winners",
                "1 without a winner",
                "0 stopped",
                "2 not reached (time budget)",
            ],
        ),
    ],
)
def test_the_closing_line_counts_operators_winners_and_stops(speedups, errors, unreached, parts) -> None:
    ops = [{"name": f"w{i}", "verified": True, "speedup": s} for i, s in enumerate(speedups)]
    ops += [{"name": f"e{i}", "error": "x", "verified": False} for i in range(errors)]
    ops += [
        {"name": f"u{i}", "verified": False, "stopped": {"reason": "not_reached"}} for i in range(unreached)
    ]
    if not speedups and not errors:
        ops.append({"name": "plain", "verified": False, "speedup": 1.0})
    assert report.closing_parts([OperatorSummary.from_json(o) for o in ops]) == parts


def test_every_verdict_says_why_in_the_report(tmp_path: Path) -> None:
    """report.json gives each candidate's reason: a suspect its physics bound, a correct one its interval."""
    base = judged({"VEC": 0}, Outcome.OK, 1.0, agent="baseline")
    win = judged({"VEC": 8}, Outcome.BETTER, 3.0, parent=base.candidate.hash)
    slow = judged({"VEC": 4}, Outcome.OK, 0.8, parent=base.candidate.hash)
    suspect = judged({"VEC": 16}, Outcome.SUSPECT, 900.0, parent=base.candidate.hash)
    suspect.notes = [
        "second look: undecided",
        "suspect: t::test_perf: moved 64 MB in 1 us, beyond the 80 GB/s",
    ]
    broken = judged({"VEC": 2}, Outcome.INCORRECT, parent=base.candidate.hash)
    broken.failures = ["t::test_f: max error 0.5 > 1e-05"]
    op = Operator(name="f", family="elementwise", toolchain="c", source=tmp_path / "f.c")
    summary = report.operator_summary(
        op=op,
        search=Searched(base, win, [win, slow, suspect, broken], 4, 1),
        verified=win,
        winner=Winner("kope/f", "abc"),
        note="",
        seconds_spent=1.0,
    ).to_json()
    reasons = {c["outcome"] + str(c["params"]["VEC"]): c["reason"] for c in summary["candidates"]}
    assert reasons["better8"].startswith(
        "correct and faster beyond noise: 3.000x the incumbent, 95% interval"
    )
    assert reasons["ok4"].startswith("correct, not faster beyond noise: 0.800x")
    assert reasons["suspect16"] == "t::test_perf: moved 64 MB in 1 us, beyond the 80 GB/s"
    assert reasons["incorrect2"] == "t::test_f: max error 0.5 > 1e-05"


def test_a_summary_read_back_writes_the_same_entry(tmp_path: Path) -> None:
    """report.json's entry is written in one place (`to_json`), and what `from_json` reads back from
    it writes the same keys in the same order: null ones in a full account, none of an absent field,
    and a key the publisher adds that this version does not name."""
    entry = run_data(tmp_path)["operators"][0]
    stop = entry.pop("stopped")
    entry.update(winner_file="/f.c", peers={"headline": "h"}, push="pushed", later="kept", plot="f.png")
    entry.update(flaky_tests=[], stopped=stop)
    assert list(OperatorSummary.from_json(entry).to_json().items()) == list(entry.items())
    assert entry["branch"] == "kope/f" and "error" not in entry and "search_failed" not in entry
    error = {"name": "g", "error": "x", "verified": False, "stopped": stopped(Stop.ERROR, "x")}
    assert list(OperatorSummary.from_json(error).to_json().items()) == list(error.items())
    assert OperatorSummary.from_json(error).failed and not OperatorSummary.from_json(entry).failed
