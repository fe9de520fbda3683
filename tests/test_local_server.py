"""The LLM agent against a self-hosted model server as llama.cpp was seen to behave (issue 52): slow
generation that goes on after the client leaves, one slot, a small context stated in `/v1/models` and
`/props` (or only in its 400), `tools` ignored. A scripted server (chat_server.py) over real HTTP with
the real `openai` client, the real gcc and sandbox; one test (or a few) per item of the issue."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chat_server import ChatServer, completion, generating, status, tool_call
from test_claude_agent import FASTER, KERNEL, Memory, make_ctx

from pytest_kope.agents.base import Context
from pytest_kope.agents.llm import LlmAgent, inflight, openai_agent
from pytest_kope.agents.llm.record import write
from pytest_kope.agents.llm.tools import unfenced_candidate
from pytest_kope.agents.llm.wire import context_numbers
from pytest_kope.memory.recall import Recall
from pytest_kope.review.report_md import markdown

KEY = "sk-local-test-SECRET-0123456789abcdef"
ROOT = Path(__file__).resolve().parent.parent
MakeAgent = Callable[..., LlmAgent]
PROSE = "Sure! To make this faster I would vectorize the loop and unroll it by four. " * 3


@pytest.fixture
def servers() -> Iterator[Callable[..., ChatServer]]:
    made: list[ChatServer] = []

    def make(**kw: Any) -> ChatServer:
        server = ChatServer(**kw).start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def agent_for() -> Iterator[Callable[..., LlmAgent]]:
    made: list[LlmAgent] = []

    def make(server: ChatServer, **kw: Any) -> LlmAgent:
        kw = {
            "model": "gemma3",
            "api_key": KEY,
            "base_url": server.url,
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


def submit(source: str = FASTER) -> dict[str, Any]:
    return tool_call("submit_candidate", {"source": source, "idea": "vectorize with omp simd"})


def unfenced(source: str = FASTER) -> str:
    """A small model's answer: an idea, then the whole kernel with no code fence."""
    return f"Idea: vectorize the loop with omp simd\n\n{source}\nThis should be faster.\n"


def big_ctx(deadline: float | None = None) -> Context:
    ctx = make_ctx(Memory("lesson: " + "unroll by eight and prefetch the next row " * 300))
    ctx.deadline = deadline
    return ctx


def left(server: ChatServer, i: int = 0, within: float = 2.0) -> float:
    """When the client left stream `i`, as the server noticed it (at its next write)."""
    deadline = time.monotonic() + within
    while server.streams[i].left_at is None:
        assert time.monotonic() < deadline, f"the server never noticed the client leave: {server.streams[i]}"
        time.sleep(0.02)
    return float(server.streams[i].left_at or 0)


def tokens_sent(body: dict[str, Any]) -> int:
    from chat_server import prompt_tokens

    return prompt_tokens(body)


# -- 1. time the user controls -----------------------------------------------------------------------


def test_max_tokens_fits_what_the_prompt_leaves_of_the_servers_context(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers(context=3000)
    server.push(completion(submit()))
    agent = agent_for(server, max_output_tokens=2000)
    assert len(agent.propose(big_ctx(), 1)) == 1
    (body,) = server.bodies
    assert server.overflows == 0 and body["max_tokens"] <= 2000
    assert tokens_sent(body) + body["max_tokens"] <= 3000  # by the server's own count
    assert any("context 3000 tokens" in n and "/props" in n for n in agent.usage()["notes"])


def test_a_time_out_closes_the_stream_so_the_retry_is_not_queued_behind_it(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    """llama.cpp generates for a client that left until a write fails: a time-out that only stopped
    reading would leave the one slot busy for the whole reply, and the retry would wait behind it."""
    server = servers()
    server.push(generating(completion(content=PROSE * 4), pace=0.05), completion(submit()))  # ~8 s of tokens
    agent = agent_for(server, timeout=1.0)
    records: list[dict[str, Any]] = []
    agent.prompt_sink = records.append
    began = time.monotonic()
    assert len(agent.propose(make_ctx(), 1)) == 1
    took = time.monotonic() - began
    cut = next(r for r in records if r["kind"] == "call" and r["error"])
    assert cut["reply"]["partial"] and cut["reply"]["text"].startswith("Sure! To make this faster")
    first, second = server.streams
    assert first.left_at is not None and 1.0 <= first.left_at < 2.0, first  # left at its time-out
    assert first.chunks < first.of  # and the server stopped generating then
    assert second.began - first.ended < 0.5 and took < 4.0, (took, first, second)
    (retry,) = agent.usage()["retries"]
    assert "time-out" in retry


def test_the_time_budget_bounds_the_call_and_its_retries(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers()
    server.push(generating(completion(content=PROSE * 20), pace=0.05))
    agent = agent_for(server, timeout=60, least_call_s=0.2)
    began = time.monotonic()
    assert agent.propose(big_ctx(deadline=time.monotonic() + 1.5), 1) == []
    assert time.monotonic() - began < 3.0 and len(server.requests) == 1  # no retry past the budget
    assert "time budget (--kope-time-budget) ended the call" in agent.usage()["faults"][-1]
    assert left(server) < 2.5
    # a 429 asking for a wait longer than the budget leaves: the round ends, no sleep
    server.push(status(429, headers={"retry-after": "30"}), completion(submit()))
    began = time.monotonic()
    assert agent.propose(big_ctx(deadline=time.monotonic() + 10), 1) == []
    assert time.monotonic() - began < 3.0 and "no time to retry" in agent.usage()["faults"][-1]
    # and a round whose deadline has passed makes no call at all
    asked = len(server.requests)
    assert agent.propose(big_ctx(deadline=time.monotonic() + 0.1), 1) == []
    assert len(server.requests) == asked and "leaves no time for a model call" in agent.usage()["faults"][-1]


def test_a_long_call_says_its_progress(
    servers: Callable[..., ChatServer], agent_for: MakeAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inflight, "TICK_S", 0.3)
    server = servers()
    server.push(generating(completion(submit()), pace=0.03, first=0.8))
    agent = agent_for(server)
    lines: list[str] = []
    agent.line_sink = lines.append
    assert len(agent.propose(make_ctx(), 1)) == 1
    assert any("model call 1 of round 1: no token yet after" in line for line in lines), lines
    assert any("tokens received in" in line for line in lines), lines
    assert all(line.startswith("kope scale: ") for line in lines)


def test_a_reply_that_goes_round_in_a_loop_is_cut_and_kept(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    """A small model that has lost its way writes one line until max_tokens: the stream is closed
    once the reply repeats itself, what it said is kept, and it is reminded once."""
    loop = "Let me think about the kernel.\n" + "## Task: the candidate must implement their own code\n" * 400
    server = servers()
    server.push(generating(completion(content=loop), pace=0.002), completion(submit()))
    agent = agent_for(server)
    records: list[dict[str, Any]] = []
    agent.prompt_sink = records.append
    assert len(agent.propose(make_ctx(), 1)) == 1
    assert left(server) >= 0 and server.streams[0].chunks < server.streams[0].of // 2
    first = next(r for r in records if r["kind"] == "call")
    assert first["reply"]["stop"] == "repeating" and "## Task: the candidate" in first["reply"]["text"]
    assert first["outcome"] == "no candidate in the reply: reminded once"
    assert any("said one thing over and over" in n for n in agent.usage()["notes"])


def test_looping_is_one_piece_said_again_and_again() -> None:
    from pytest_kope.agents.llm.provider_openai import looping

    assert looping("intro\n" + "the same line\n" * 60) and looping("ab" * 400)
    assert not looping(FASTER) and not looping(PROSE) and not looping("x = 1;\n" * 3)


# -- 2. Ctrl-C ends the agent too -------------------------------------------------------------------


def test_cancel_ends_the_call_in_flight_at_once_and_no_call_follows(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers()
    server.push(generating(completion(content=PROSE * 20), pace=0.05), completion(submit()))
    agent = agent_for(server, timeout=60)
    threading.Timer(0.7, agent.cancel, ("SIGINT",)).start()
    began = time.monotonic()
    assert agent.propose(make_ctx(), 1) == []
    assert time.monotonic() - began < 2.0 and len(server.requests) == 1
    assert left(server) < 1.5
    assert any("cancelled by SIGINT" in n for n in agent.usage()["notes"])
    assert agent.usage()["faults"] == []
    assert agent.propose(make_ctx(), 1) == [] and len(server.requests) == 1  # no new round


# -- 3. context that fits the server -----------------------------------------------------------------


def test_the_first_prompt_fits_a_small_context_the_server_states(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers(context=2500)
    server.push(completion(submit()))
    agent = agent_for(server)
    records: list[dict[str, Any]] = []
    agent.prompt_sink = records.append
    assert len(agent.propose(big_ctx(), 1)) == 1
    assert server.overflows == 0  # fitted from the start, not after a 400
    (body,) = server.bodies
    assert tokens_sent(body) + body["max_tokens"] <= 2500
    (opening,) = [r for r in records if r["kind"] == "prompt"]
    assert opening["fit"]["level"] > 0 and opening["fit"]["context"] == 2500
    assert "the server's tokenizer" in opening["fit"]["counter"]  # counted by /tokenize's ratio


def test_a_server_that_says_nothing_is_fitted_to_the_numbers_of_its_400(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers(context=3000, says=False)
    server.push(completion(submit()))
    agent = agent_for(server)
    assert len(agent.propose(big_ctx(), 1)) == 1
    assert server.overflows == 1 and len(server.requests) == 2  # one 400, then one resend that fits
    assert tokens_sent(server.bodies[1]) + server.bodies[1]["max_tokens"] <= 3000
    assert "refitted to the model's context 3000 tokens" in agent.usage()["retries"][0]


def test_no_source_twice_and_no_path_of_this_machine(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    ctx = make_ctx()
    ctx.operator.tests = {"/home/someone/work/ops/scale/test_scale.py": "def test_scale(kernel): ...\n"}
    best = {
        "kind": "best",
        "operator": "scale",
        "hardware": "Test CPU 9000",
        "speedup": 1.0,
        "outcome": "ok",
        "params": {},
        "idea": "committed kernel",
        "source": KERNEL,  # what recall attaches to a `best` exemplar: the committed source itself
    }
    ctx.recall = lambda state, budget: Recall(exemplars=[best])
    server = servers()
    server.push(completion(submit()))
    assert len(agent_for(server).propose(ctx, 1)) == 1
    sent = json.dumps(server.bodies[0]["messages"])
    assert sent.count(json.dumps(KERNEL)[1:-1]) == 1 and "(its source is shown above)" in sent
    assert "/home/someone" not in sent and "### test_scale.py" in sent


def test_kope_context_prints_the_fitted_prompt_with_the_runs_counter(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "sample_ops" / "rowsum", repo / "rowsum")
    shutil.copy(ROOT / "sample_ops" / "pytest.ini", repo / "pytest.ini")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "OPENAI_BASE_URL"}
    cmd = [sys.executable, "-m", "pytest_kope.cli", "context", "rowsum", "--repo", str(repo)]

    def context(size: int) -> tuple[str, str]:
        done = subprocess.run(
            [*cmd, "--agent", "openai:gemma3", "--context", str(size)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return next(x for x in done.stdout.splitlines() if x.startswith("## Fit: ")), done.stdout

    fit, out = context(8192)
    assert "context 8192 tokens (from --context)" in fit and "2.5 characters per token" in fit, fit
    tokens = int(fit.split("prompt ")[1].split()[0])
    room = int(fit.split("room for the prompt ")[1].split(",")[0])
    assert tokens <= room < 8192 and str(repo) not in out  # and no path of this machine
    blocks = [
        int(x.split("(")[1].split()[0]) for x in out.splitlines() if x.startswith("## ") and " tokens)" in x
    ]
    assert len(blocks) == 3 and sum(blocks) <= tokens  # by the same counter, within the whole (tools too)
    assert context(2048)[0].endswith("DOES NOT FIT: not sent")  # the kernel and a reply cannot fit


# -- 4. servers without tool calls -------------------------------------------------------------------


def test_a_server_that_ignores_tools_gets_plain_text_and_an_unfenced_kernel_is_judged(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers()  # says nothing of tools, and answers a request with tools in prose
    server.push(completion(content=PROSE), completion(content=unfenced()))
    agent = agent_for(server)
    (cand,) = agent.propose(make_ctx(), 1)
    assert cand.source.startswith("// kope: kernel") and cand.idea == "vectorize the loop with omp simd"
    first, second = server.bodies
    assert "tools" in first and "tools" not in second
    assert "Answer in plain text" in second["messages"][0]["content"]
    assert any("answered a request with tools in prose" in n for n in agent.usage()["notes"])


def test_a_server_whose_template_does_no_tool_calls_gets_plain_text_from_the_start(
    servers: Callable[..., ChatServer], agent_for: MakeAgent
) -> None:
    server = servers(context=16384, tools=False)
    server.push(completion(content=unfenced()))
    assert len(agent_for(server).propose(make_ctx(), 1)) == 1
    (body,) = server.bodies
    assert "tools" not in body and "Answer in plain text" in body["messages"][0]["content"]


def test_only_a_whole_kernel_without_a_fence_is_a_candidate() -> None:
    kernels = ("void scale(const float *x, float *y, int n)",)
    (found,) = unfenced_candidate(unfenced(), kernels, "scale.c")
    assert found["source"].rstrip().endswith("}") and "This should be faster" not in found["source"]
    assert unfenced_candidate(PROSE, kernels, "scale.c") == []
    assert unfenced_candidate("void scale(const float *x, float *y, int n);\n", kernels, "scale.c") == []
    assert unfenced_candidate("```c\n" + FASTER + "```\n", kernels, "scale.c") == []  # fenced: the other path


# -- 5. everything the model said is kept ------------------------------------------------------------


def test_every_request_and_reply_is_kept_and_a_resend_overwrites_nothing(
    servers: Callable[..., ChatServer], agent_for: MakeAgent, tmp_path: Path
) -> None:
    server = servers(context=3000, says=False)
    server.push(
        status(500, f"boom {KEY}", headers={"retry-after": "0"}), completion(content=f"{unfenced()} {KEY}")
    )
    agent = agent_for(server)
    agent.prompt_sink = lambda made: write(tmp_path, made).relative_to(tmp_path)
    assert len(agent.propose(big_ctx(), 1)) == 1
    names = sorted(p.name for p in (tmp_path / "prompts" / "scale").iterdir())
    assert names == sorted(
        f"round-001{tail}{ext}"
        for tail in ("", "-resend-1", "-call-01", "-call-02", "-call-03")
        for ext in (".json", ".txt")
    ), names
    calls = [
        json.loads((tmp_path / "prompts" / "scale" / f"round-001-call-0{i}.json").read_text())
        for i in (1, 2, 3)
    ]
    assert "exceeds the available context size" in calls[0]["error"] and "HTTP 500" in calls[1]["error"]
    assert "vectorize the loop" in calls[2]["reply"]["text"] and calls[2]["request"]["max_tokens"] > 0
    assert "candidate 1: accepted as " in calls[2]["outcome"]  # what became of the reply
    assert calls[0]["api"] == f"the chat-completions API at {server.url}"
    every = "".join(p.read_text() for p in (tmp_path / "prompts" / "scale").iterdir())
    assert KEY not in every and "***" in every
    report = markdown(
        {"run_id": "x", "agent": "openai:gemma3", "budget": 1, "operators": [], "usage": agent.usage()}
    )
    assert "Model transcripts" in report and "round-001-resend-1" in report and "round-001-call-03" in report


def test_a_connection_error_names_the_url(agent_for: MakeAgent) -> None:
    closed = ChatServer()  # made and closed, never started: nothing listens on its port
    url = closed.url
    closed._httpd.server_close()
    agent = openai_agent("gemma3", api_key=None, base_url=url, retry_delay=0.01, max_retries=1, timeout=5)
    try:
        assert agent.propose(make_ctx(), 1) == []
    finally:
        agent.close()
    (fault,) = agent.usage()["faults"]
    assert (
        f"connection error talking to the chat-completions API at {url}" in fault and "after 2 tries" in fault
    )


def test_context_errors_are_read_in_each_servers_words() -> None:
    assert context_numbers(
        "request (5230 tokens) exceeds the available context size (4096 tokens), try increasing it"
    ) == (4096, 5230)
    assert context_numbers(
        "This model's maximum context length is 4096 tokens. However, you requested 13422 tokens "
        "(5230 in the messages, 8192 in the completion). Please reduce the length of the messages or completion."
    ) == (4096, 5230)
    said = "the request exceeds the available context size, try increasing it"  # llama.cpp, earlier
    body = {"error": {"message": said, "n_ctx": 4096, "n_prompt_tokens": 5230}}
    assert context_numbers(said, body) == (4096, 5230)
    assert context_numbers("prompt is too long: 210000 tokens > 200000 maximum") == (200000, 210000)
    assert context_numbers("prompt is too long") == (None, None)


# -- the run, end to end: Ctrl-C during a model call -------------------------------------------------


def test_one_ctrl_c_during_a_model_call_ends_the_run_within_seconds_with_its_report(
    servers: Callable[..., ChatServer], tmp_path: Path
) -> None:
    server = servers(context=8192, tools=False)
    server.push(generating(completion(content=PROSE * 40), pace=0.1))  # a minute of tokens
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "sample_ops" / "rowsum", repo / "rowsum")
    shutil.copy(ROOT / "sample_ops" / "pytest.ini", repo / "pytest.ini")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env |= {"OPENAI_BASE_URL": server.url, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kope-optimize", "--kope-no-commit"]
    cmd += ["--kope-agent", "openai:gemma3", "--kope-budget", "4"]
    out = tmp_path / "run.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 400
    while not server.streams or server.streams[0].chunks < 3:  # the model is answering
        assert proc.poll() is None, out.read_text()
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    code = proc.wait(60)
    took = time.monotonic() - signalled
    text = out.read_text()
    assert code == 2 and took < 15, (took, text[-4000:])
    assert "kope: SIGINT: stopping" in text and "Traceback" not in text and "kope: results" in text
    assert len(server.requests) == 1 and left(server) < 120  # closed, and no request after it
    (run_dir,) = (repo / ".kope" / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["operators"][0]["stopped"]["reason"] == "interrupted"
    assert (run_dir / "prompts" / "rowsum" / "round-001-call-01.json").exists()
    assert "round-001-call-01" in (run_dir / "report.md").read_text()
