"""One scenario through both providers, end to end: `pytest --kope-optimize` with `--kope-agent claude`
against the scripted Messages server and with `--kope-agent openai:MODEL` against the scripted
chat-completions server. The same loop must give the same outcomes: candidates judged, tokens
counted, the prompt recorded in the run folder, and the key nowhere but the HTTP header."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

import chat_server as chat
import messages_server as messages
import pytest
from op_repos import SCALE_C, UNJAILED, git

FAST = SCALE_C.replace("// kope: flags -O0 | -O2 -march=native", "// kope: flags -O2 -march=native | -O0")
BROKEN = SCALE_C.replace("y[i] = 2.0f * x[i];\n}", "y[i] = 2.0f * x[i]\n}")
IDEAS = {"drop a semicolon": BROKEN, "build with -O2 -march=native": FAST}


@dataclass
class Provider:
    """How the scenario is said in one provider's protocol."""

    agent: str
    key: str
    env: dict[str, str]
    server: Any

    def script(self) -> list[Any]:
        """A 429, then a broken candidate, then a good one: (input, output, cached) tokens each."""
        submits = [{"source": src, "idea": idea} for idea, src in IDEAS.items()]
        if self.agent == "claude":
            return [
                messages.status(429, headers={"retry-after": "0"}),
                messages.reply(
                    messages.tool_call("submit_candidate", submits[0]),
                    tokens=messages.usage(1200, 300, cache_creation=900),
                ),
                messages.reply(
                    messages.tool_call("submit_candidate", submits[1]),
                    tokens=messages.usage(150, 200, cache_read=900),
                ),
            ]
        return [
            chat.status(429, headers={"retry-after": "0"}),
            chat.completion(chat.tool_call("submit_candidate", submits[0]), tokens=chat.usage(1200, 300)),
            chat.completion(
                chat.tool_call("submit_candidate", submits[1]), tokens=chat.usage(1050, 200, cached=900)
            ),
        ]


@pytest.fixture(params=["claude", "openai"])
def provider(request: pytest.FixtureRequest) -> Any:
    if request.param == "claude":
        server: Any = messages.MessagesServer().start()
        key = "sk-ant-contract-SECRET-5521"
        found = Provider("claude", key, {"ANTHROPIC_API_KEY": key, "ANTHROPIC_BASE_URL": server.url}, server)
    else:
        server = chat.ChatServer().start()
        key = "sk-contract-openai-SECRET-0123456789"
        env = {"DEEPSEEK_API_KEY": key, "OPENAI_BASE_URL": server.url}
        found = Provider("openai:deepseek-chat", key, env, server)
    yield found
    server.stop()


def test_the_same_scenario_gives_the_same_outcomes_on_every_provider(
    pytester: pytest.Pytester, op_repo: Any, provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in provider.env.items():
        monkeypatch.setenv(name, value)
    ini = pytester.path / "pytest.ini"  # the key's variable is named in the ini file; the key is not
    ini.write_text(ini.read_text() + "kope_openai_key_env = DEEPSEEK_API_KEY\n")
    provider.server.push(*provider.script())
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kope-optimize", "--kope-agent", provider.agent, *UNJAILED,
        "--kope-budget", "2", timeout=600,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    (run,) = (pytester.path / ".kope" / "runs").iterdir()
    data = json.loads((run / "report.json").read_text())
    (op,) = data["operators"]
    outcomes = {c["idea"]: c["outcome"] for c in op["candidates"]}
    assert outcomes["drop a semicolon"] == "compile_failed"  # judged: built in the jail, refused there
    assert outcomes["build with -O2 -march=native"] in ("better", "ok")  # the win itself is timing's call
    usage = data["usage"]
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == (2, 1350, 500)
    assert usage["cache_read_input_tokens"] == 900 and usage["per_operator"]["scale"]["calls"] == 2
    assert any("HTTP 429" in r for r in usage["retries"]) and usage["faults"] == []
    assert usage["provider"] == ("anthropic" if provider.agent == "claude" else "openai")
    row = next(
        line for line in (run / "report.md").read_text().splitlines() if f"| {provider.agent} (" in line
    )
    assert "1,350" in row and "900" in row
    db = pytester.path / ".kope" / "experience.db"
    sums = sqlite3.connect(db).execute(
        "SELECT count(*), sum(input_tokens), sum(output_tokens) FROM llm_calls"
    )
    assert sums.fetchone() == (2, 1350, 500)
    # every round's prompt, as sent, is in the run folder, with why each recalled item is in it
    record = json.loads((run / "prompts" / "scale" / "round-001.json").read_text())
    assert "kope: kernel void scale" in record["static"] and "## Recalled experience" in record["dynamic"]
    assert record["recall"]["budget_tokens"] == 1500 and record["model"] in json.dumps(
        provider.server.bodies[0]
    )
    assert "## Static block" in (run / "prompts" / "scale" / "round-001.txt").read_text()
    # the key is only in the HTTP header: not in the graph, the run folder, the branch, the prompts
    assert provider.key.encode() not in db.read_bytes()
    for path in run.rglob("*"):
        assert not path.is_file() or provider.key not in path.read_text(errors="replace"), path
    assert provider.key not in git(pytester.path, "log", "-p", "--all")
    for r in provider.server.requests:
        assert provider.key not in json.dumps(r.body)
        assert provider.key in r.headers.get("x-api-key", "") + r.headers.get("authorization", "")


def test_the_token_budget_stops_the_agent_for_the_operator_cleanly(
    pytester: pytest.Pytester, op_repo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = messages.MessagesServer().start()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-budget-SECRET-77")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    plain = "\n".join(
        line for line in SCALE_C.splitlines() if "kope: param" not in line and "kope: flags" not in line
    )
    submit = {"source": plain + "\n// by hand\n", "idea": "no knobs"}  # nothing for a tuner to sweep
    server.push(
        messages.reply(messages.tool_call("submit_candidate", submit), tokens=messages.usage(4000, 500))
    )
    try:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--kope-optimize", "--kope-agent", "claude", *UNJAILED,
            "--kope-budget", "3", "--kope-max-tokens", "6000", "--kope-no-commit", timeout=600,
        )  # fmt: skip
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()
    (report,) = (pytester.path / ".kope" / "runs").glob("*/report.json")
    data = json.loads(report.read_text())
    (op,) = data["operators"]
    assert [c["idea"] for c in op["candidates"]] == ["no knobs"] and len(server.requests) == 1
    assert op["stopped"]["reason"] == "agent_done", op["stopped"]
    assert "token budget for scale spent: 4500 of 6000 tokens used" in op["stopped"]["detail"]
    assert data["usage"]["faults"] == [] and server.exhausted == 0
