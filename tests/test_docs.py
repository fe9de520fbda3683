"""Every --kope-* option is in `pytest --help` and in the README; every hookspec is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_kope import hookspecs

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def kope_options(pytester: pytest.Pytester) -> set[str]:
    return set(re.findall(r"--kope-[a-z-]+", pytester.runpytest_subprocess("--help").stdout.str()))


def test_help_lists_every_option_and_the_readme_documents_them(pytester: pytest.Pytester) -> None:
    options = kope_options(pytester)
    expected = {
        "--kope-optimize",
        "--kope-budget",
        "--kope-agent",
        "--kope-model",
        "--kope-db",
        "--kope-branch-prefix",
        "--kope-no-commit",
        "--kope-report",
        "--kope-seeds",
        "--kope-max-tokens",
        "--kope-devices",
        "--kope-allow-unjailed",
        "--kope-push",
        "--kope-pr",
        "--kope-since",
        "--kope-patience",
        "--kope-explore",
        "--kope-time-budget",
        "--kope-executor",
        "--kope-concurrency",
        "--kope-ray-repo",
    }
    assert expected <= options
    missing = sorted(o for o in options if o not in README)
    assert not missing, f"README.md does not document {missing}"


def test_every_hookspec_has_an_example_and_is_in_the_readme() -> None:
    names = [n for n in dir(hookspecs) if n.startswith("pytest_kope_")]
    assert len(names) >= 5
    for name in names:
        doc = getattr(hookspecs, name).__doc__ or ""
        assert "Example" in doc and "versionadded" in doc, name
        assert name in README, f"README.md does not mention hook {name}"


def test_readme_quick_start_has_the_main_job_and_ci_runs_the_readme_test_command() -> None:
    assert "pytest sample_ops --kope-optimize --kope-agent tuner" in README
    command = "pip install torch==2.13.0 && pip install -e '.[test,triton,ray]' && python -m pytest"
    assert command in README
    # CI runs each step on a line of its own, in order: under `set -e` a failure inside `a && b` would
    # not stop the script, and CI's result would come from the steps after it
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [lines.index(step) for step in command.split(" && ")]
    assert steps == sorted(steps), steps
    assert "set -euo pipefail" in lines


def test_a_conftest_can_override_every_hook(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        def pytest_kope_make_toolchain(name, config):
            return None
        def pytest_kope_toolchain_names(config):
            return ["mine"]
        def pytest_kope_make_agent(name, config):
            return None
        def pytest_kope_candidate_judged(operator, result, config):
            pass
        def pytest_kope_operator_done(operator, summary, config):
            pass
        """
    )
    pytester.makepyfile("def test_x():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_readme_says_how_to_bring_your_own_model(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    for ini in ("kope_openai_base_url", "kope_openai_key_env"):
        assert ini in help_text and f"`{ini}`" in README, ini
    section = README.split("## Bring your own model")[1].split("\n## ")[0]
    for server in ("vLLM", "Ollama", "DeepSeek"):
        assert server in section, server
    assert section.count("--kope-agent openai:") >= 3 and "OPENAI_BASE_URL" in section
    assert "kope_openai_key_env=DEEPSEEK_API_KEY" in section  # the ini names the variable, not the key
    assert "kope context OP [--agent claude|openai:MODEL] [--context N] [--repo DIR]" in section
    assert "prompts/<operator>/round-NNN.json" in section
    from pytest_kope import cli

    assert "kope context" in (cli.__doc__ or "") and "kope context softmax" in README


def test_the_code_layout_names_files_that_exist() -> None:
    """Every module and folder the README's layout names is where it says (a move updates it)."""
    section = README.split("## How the code is laid out")[1].split("\n## ")[0]
    package = ROOT / "pytest_kope"
    folder = package
    for cell in re.findall(r"`([\w*./]+)`", section):
        if cell == "pytest_kope/" or "*" in cell:
            continue
        if cell.endswith("/"):  # a package folder, one inside the folder named last, or the repo's own
            base = next((b for b in (package, folder, folder.parent, ROOT) if (b / cell).is_dir()), None)
            assert base is not None, cell
            folder = base / cell
        elif cell.endswith(".py"):
            assert any((b / cell).exists() for b in (folder, folder.parent, package)), cell
