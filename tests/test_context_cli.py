"""`kope context OP`: the prompt the LLM agent would send now, and why each recalled piece is in it,
on copies of the sample operators after a short real tuner run (no key, nothing sent anywhere)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}  # no key is needed
    return subprocess.run(
        [sys.executable, "-m", "pytest_kope.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def copy_ops(dest: Path, *names: str) -> Path:
    for name in names:
        shutil.copytree(ROOT / "sample_ops" / name, dest / name)
    shutil.copy(ROOT / "sample_ops" / "pytest.ini", dest / "pytest.ini")
    return dest


def test_context_shows_the_prompt_and_the_right_family_and_hardware_first(tmp_path: Path) -> None:
    repo = copy_ops(tmp_path / "repo", "softmax", "layernorm")
    tuned = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kope-optimize", "--kope-agent", "tuner"]
        + ["--kope-budget", "2", "--kope-no-commit", "-q"],
        cwd=repo, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout[-3000:]
    done = kope("context", "softmax", "--repo", str(repo), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("# Prompt for softmax: agent claude, provider anthropic, model ")
    recalled = re.search(r"## Recalled experience: (\d+) of (\d+) tokens", out)
    assert recalled, out
    used, budget = map(int, recalled.groups())
    assert 0 < used <= budget == 1500
    matches = re.findall(r"^shown: lesson \(\w+\), \d+ tokens; score [\d.]+, .*match (\w+)/(\w+)$", out, re.M)
    assert matches and matches[0] == ("operator", "hardware")  # softmax's own lessons, this machine, first
    kinds = [m[0] for m in matches]
    assert "family" in kinds and kinds == sorted(kinds, key=["operator", "family", "other"].index)
    assert "on layernorm (rowwise" in out  # the family's lessons, learned on layernorm
    for part in ("## System prompt", "## Static block", "## Dynamic block", "kope: kernel void softmax"):
        assert part in out
    dynamic = out.split("## Dynamic block")[1]
    first_round = min(
        max(2, 2 * len(os.sched_getaffinity(0))), 24, 8
    )  # a run's first batch: budget, patience
    assert (
        '<untrusted-output source="experience graph' in dynamic and f"Submit up to {first_round} " in dynamic
    )
    # the same for an OpenAI-compatible model, with no key and no server anywhere
    other = kope("context", "softmax", "--repo", str(repo), "--agent", "openai:qwen2.5-coder", cwd=tmp_path)
    assert other.returncode == 0, other.stderr
    assert other.stdout.startswith("# Prompt for softmax: agent openai, provider openai, model qwen2.5-coder")


def test_context_without_a_graph_and_for_an_unknown_operator(tmp_path: Path) -> None:
    repo = copy_ops(tmp_path / "repo", "softmax")
    fresh = kope("context", "softmax", "--repo", str(repo), cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert "(nothing relevant recorded yet)" in fresh.stdout and "0 items shown" in fresh.stdout
    assert not (repo / ".kope").exists()  # looking changes nothing
    missing = kope("context", "nosuchop", "--repo", str(repo), cwd=tmp_path)
    assert missing.returncode == 2 and "no operator 'nosuchop'" in missing.stderr
    assert "(it has softmax)" in missing.stderr and len(missing.stderr.splitlines()) == 1, missing.stderr
