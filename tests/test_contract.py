"""One contract for every registered toolchain and every registered agent, the same checks for each.

Toolchains come from the registry (`pytest_kope.toolchains`); each one that works on this machine
builds a sample operator's committed kernel, and the session's own check (`--kope-check`) judges it
with the operator's tests in a judging child. One that does not work here is skipped with its own
reason. Agents come from their registry too, each made through the hook and fed what needs no key and
no network beyond this machine: the tuner searches the committed source's space, `replay` reads a
recorded folder, `claude` talks to a local Messages-API server that plays a recorded reply.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from chat_server import ChatServer, chat_server_fixture, completion  # noqa: F401  (the fixture)
from chat_server import tool_call as chat_tool_call
from messages_server import (  # noqa: F401  (the fixture `messages_server`)
    MessagesServer,
    messages_server_fixture,
    reply,
    tool_call,
)
from op_repos import SCALE_C

from pytest_kope import agents, toolchains
from pytest_kope.agents.base import Agent, Context, OperatorInfo
from pytest_kope.candidate import Candidate
from pytest_kope.judge.outcome import Judged, Outcome
from pytest_kope.memory.recall import Recall
from pytest_kope.spec import parse_spec
from pytest_kope.toolchains.base import IN, INOUT, OUT, SCALAR, Availability, Kernel, Timer, Toolchain

ROOT = Path(__file__).resolve().parents[1]
# A sample operator per toolchain: (repo folder, operator folder, committed source).
SAMPLES = {
    "c": ("sample_ops", "softmax", "softmax.c"),
    "triton": ("sample_ops_triton", "softmax", "softmax.py"),
    "triton-ascend": ("sample_ops_triton", "softmax", "softmax.py"),
}


def _registered_toolchains() -> list[str]:
    return list(toolchains._BUILTIN)


@pytest.fixture(params=_registered_toolchains())
def toolchain(request: pytest.FixtureRequest, pytestconfig: pytest.Config) -> Toolchain:
    tc = toolchains.toolchain_of(pytestconfig, request.param)
    available = tc.availability()
    assert isinstance(available, Availability) and available.reason.strip()
    if not available.ok:
        pytest.skip(f"toolchain {tc.name} is unavailable here: {available.reason}")
    if tc.name not in SAMPLES:
        pytest.skip(f"no sample operator for toolchain {tc.name} in this repository")
    return tc


def test_toolchain_describes_itself(toolchain: Toolchain, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(toolchain, Toolchain)
    assert toolchain.extensions and all(e.startswith(".") for e in toolchain.extensions)
    assert toolchain.device_env_var is None or toolchain.device_env_var.endswith("VISIBLE_DEVICES")
    assert all(isinstance(v, str) and v for v in toolchain.passes_env)
    assert toolchain.fingerprint()["toolchain"] == toolchain.name
    env = {**toolchain.passed_env(), **toolchain.environment()}
    assert isinstance(env, Mapping) and all(isinstance(v, str) for v in env.values())
    for name in toolchain.passes_env:  # what a judging child needs from here reaches it
        monkeypatch.setenv(name, "kope-contract")
        assert toolchain.passed_env()[name] == "kope-contract"
    assert isinstance(toolchain.timer(), Timer)
    assert toolchain.count_devices() >= 0


def test_toolchain_builds_its_sample_operator(toolchain: Toolchain, tmp_path: Path) -> None:
    repo, op, name = SAMPLES[toolchain.name]
    path = ROOT / repo / op / name
    assert Path(name).suffix in toolchain.extensions
    text = path.read_text()
    spec = parse_spec(text, name)
    candidate = Candidate(text, name, toolchain.name, params=spec.space.defaults)
    assert toolchain.screen(candidate) == []
    if toolchain.name == "triton-ascend":  # the build needs this process set up for the interpreter
        pytest.skip("triton-ascend builds only in a process prepared for it (its judging child)")
    kernel = toolchain.build(candidate, spec, tmp_path)
    assert isinstance(kernel, Kernel) and kernel.candidate is candidate
    declared = {k.split("(")[0].split()[-1].lstrip("*") for k in spec.kernels}
    assert set(kernel.functions) == declared
    for f in kernel.functions.values():
        assert callable(f.raw) and all(a.role in (IN, OUT, INOUT, SCALAR) for a in f.args)
    baked = toolchain.bake(text, spec.space.defaults)  # the winner's values written in as defaults
    assert parse_spec(baked, name).kernels == spec.kernels
    assert parse_spec(baked, name).space.defaults == spec.space.defaults


def test_toolchain_passes_its_sample_operators_tests_in_a_judging_child(
    toolchain: Toolchain, pytester: pytest.Pytester, pytestconfig: pytest.Config
) -> None:
    repo, op, _ = SAMPLES[toolchain.name]
    for item in (ROOT / repo).iterdir():
        if item.is_file() and item.suffix in (".ini", ".py", ".toml", ".cfg"):
            shutil.copy(item, pytester.path / item.name)
    shutil.copytree(ROOT / repo / op, pytester.path / op)
    if toolchains.toolchain_for(pytestconfig, Path(SAMPLES[toolchain.name][2])) != toolchain.name:
        pytest.skip(f"the sample operator's suffix names another toolchain than {toolchain.name}")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kope-check", timeout=600)
    result.stdout.fnmatch_lines(["kope: check *, 1 operator(s)", f"*{op}*{toolchain.name}*passes*"])
    result.stdout.no_fnmatch_line("*evaluations per operator*")  # a check optimizes nothing
    assert result.ret == 0


# -- agents --------------------------------------------------------------------------------------------

FASTER = SCALE_C.replace("    int i = 0;", "    int i = 0;\n#pragma omp simd").replace(
    "for (; i < n; i++)", "for (; i < n; i += 1)"
)


def _context() -> Context:
    spec = parse_spec(SCALE_C, "scale.c")
    info = OperatorInfo("scale", "elementwise", "c", "scale.c", SCALE_C, spec.space, spec.kernels)
    committed = Candidate(SCALE_C, "scale.c", "c", params=spec.space.defaults, idea="committed kernel")
    baseline = Judged(committed, Outcome.OK, speedup=1.0)

    def recall(state: str = "", budget: int = 12) -> Recall:
        return Recall()

    return Context(info, {"arch": "x86_64"}, baseline, baseline, [baseline], 8, recall, lambda h: False)


@pytest.fixture
def recorded(
    tmp_path: Path, messages_server: MessagesServer, chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """What each agent is fed: a replay folder, and a recorded reply on the local Messages API and on
    the local chat-completions API."""
    (tmp_path / "scale").mkdir()
    (tmp_path / "scale" / "simd.c").write_text(FASTER)
    submit = {"source": FASTER, "idea": "vectorize the tail with omp simd"}
    messages_server.push(reply(tool_call("submit_candidate", submit)))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-contract")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", messages_server.url)
    chat_server.push(completion(chat_tool_call("submit_candidate", submit)))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-contract-openai")
    monkeypatch.setenv("OPENAI_BASE_URL", chat_server.url)
    return tmp_path


@pytest.fixture(params=agents.names())
def agent(request: pytest.FixtureRequest, pytestconfig: pytest.Config, recorded: Path) -> Iterator[Agent]:
    name = {"replay": f"replay:{recorded}", "openai": "openai:test-model"}.get(request.param, request.param)
    made = pytestconfig.hook.pytest_kope_make_agent(name=name, config=pytestconfig)
    assert made is not None, f"the registry makes no agent {name!r}"
    yield made
    close: Callable[[], Any] | None = getattr(made, "close", None)
    if close is not None:
        close()


def test_agent_proposes_candidates_that_keep_the_interface(agent: Agent) -> None:
    assert isinstance(agent, Agent) and agent.name in agents.names()
    ctx = _context()
    proposed = agent.propose(ctx, 2)
    assert 1 <= len(proposed) <= 2, agent.usage()
    for c in proposed:
        assert isinstance(c, Candidate) and c.agent == agent.name
        assert (c.filename, c.toolchain) == ("scale.c", "c")
        assert c.parent == ctx.incumbent.candidate.hash and c.hash != ctx.baseline.candidate.hash
        assert isinstance(c.idea, str) and c.idea.strip()
        assert parse_spec(c.source, c.filename).kernels == ctx.operator.kernels
    observe: Callable[[Context, list[Judged]], object] = agent.observe  # a plugin's agent: what it gives back
    assert observe(ctx, [Judged(c, Outcome.OK) for c in proposed]) is None
    usage = agent.usage()
    assert isinstance(usage, dict)
    assert agent.propose(ctx, 0) == []
