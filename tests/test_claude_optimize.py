"""`pytest --kope-optimize --kope-agent claude` end to end against a scripted Messages server."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from messages_server import MessagesServer, garbage, reply, status, tool_call, usage
from op_repos import SCALE_C, UNJAILED, git

KEY = "sk-ant-test-SECRET-e2e-7731"
FAST = SCALE_C.replace("// kope: flags -O0 | -O2 -march=native", "// kope: flags -O2 -march=native | -O0")
BROKEN = SCALE_C.replace("y[i] = 2.0f * x[i];\n}", "y[i] = 2.0f * x[i]\n}")


@pytest.fixture
def server():
    s = MessagesServer().start()
    yield s
    s.stop()


def run(pytester: pytest.Pytester, server: MessagesServer, monkeypatch, *args: str):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kope-optimize", "--kope-agent", "claude", *UNJAILED, *args, timeout=600
    )


def report(pytester: pytest.Pytester) -> dict[str, Any]:
    (path,) = (pytester.path / ".kope" / "runs").glob("*/report.json")
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def test_model_candidates_go_through_judging_to_a_verified_winner(pytester, op_repo, server, monkeypatch):
    server.push(
        status(
            429,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            headers={"retry-after": "0"},
        ),
        reply(
            tool_call("submit_candidate", {"source": BROKEN, "idea": "drop a semicolon"}),
            tokens=usage(1200, 300, cache_creation=900),
        ),
        reply(
            tool_call("submit_candidate", {"source": FAST, "idea": "build with -O2 -march=native"}),
            tokens=usage(150, 200, cache_read=900),
        ),
    )
    result = run(pytester, server, monkeypatch, "--kope-budget", "2")
    assert result.ret == 0, result.stdout.str()
    data = report(pytester)
    (op,) = data["operators"]
    outcomes = {c["idea"]: c["outcome"] for c in op["candidates"]}
    assert outcomes == {"drop a semicolon": "compile_failed", "build with -O2 -march=native": "better"}
    assert op["verified"] and op["branch"] == "kope/scale"
    assert data["usage"]["calls"] == 2  # answered calls; the 429 was retried
    assert data["usage"]["input_tokens"] == 1350 and data["usage"]["output_tokens"] == 500
    assert data["usage"]["cache_read_input_tokens"] == 900
    assert any("HTTP 429, retried" in r for r in data["usage"]["retries"])
    db = sqlite3.connect(pytester.path / ".kope" / "experience.db")
    assert db.execute("SELECT count(*), sum(input_tokens), sum(output_tokens) FROM llm_calls").fetchone() == (
        2,
        1350,
        500,
    )
    # the key is nowhere: not in the graph, the run dir, the branch
    assert KEY.encode() not in (pytester.path / ".kope" / "experience.db").read_bytes()
    for path in (pytester.path / ".kope" / "runs").rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path
    assert KEY not in git(pytester.path, "log", "-p", "kope/scale")
    # the static prompt carries the kernel and the tests, and is marked for caching
    body = json.dumps(server.requests[-1].body)
    assert (
        "kope: kernel void scale" in body and "test_scale_matches_numpy" in body and "cache_control" in body
    )


@pytest.mark.parametrize("fault", ["garbage", "500", "unreachable"])
def test_an_agent_that_proposes_nothing_for_its_faults_fails_the_run_and_says_why(
    pytester, op_repo, server, monkeypatch, fault
):
    """The first fault on the terminal, the report's `search_failed`, exit status 1, and the closing
    line never calls it green (a key with no reachable API once read "1 verified winner")."""
    bad = (
        garbage()
        if fault == "garbage"
        else status(500, {"type": "error", "error": {"type": "api_error", "message": "boom"}})
    )
    server.push(*[bad] * 12)
    if fault == "unreachable":
        server.stop()  # the key is set, the API is not there: connection refused
    result = run(pytester, server, monkeypatch, "--kope-budget", "2", "--kope-no-commit")
    out = result.stdout.str()
    assert result.ret == 1, out
    said = {"garbage": "malformed reply", "500": "HTTP 500", "unreachable": "connection error"}[fault]
    line = next(x for x in out.splitlines() if "the claude agent proposed no candidate:" in x)
    assert said in line, line
    assert "1 search failed" in out.splitlines()[-1] and "0 verified winners" in out.splitlines()[-1], out
    data = report(pytester)
    assert data["usage"]["faults"], data["usage"]
    (op,) = data["operators"]
    assert op["verified"] is False and said in op["search_failed"], op
    assert op["stopped"]["reason"] == "error", op["stopped"]


def test_tuner_sweeps_the_knobs_a_model_candidate_declares(pytester, op_repo, server, monkeypatch):
    server.push(reply(tool_call("submit_candidate", {"source": FAST, "idea": "native build, unroll knob"})))
    result = run(pytester, server, monkeypatch, "--kope-budget", "3", "--kope-no-commit")
    assert result.ret == 0, result.stdout.str()
    candidates = report(pytester)["operators"][0]["candidates"]
    model = next(c for c in candidates if c["agent"] == "claude")
    swept = [c for c in candidates if c["agent"] == "tuner"]
    assert model["outcome"] == "better"
    assert swept and all(c["parent"] == model["id"] for c in swept)
