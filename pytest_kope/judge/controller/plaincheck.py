"""The last check before a commit: the operator's own test files, run by plain `pytest` (no
`--kope-optimize`) on a copy of the tree to be committed, the winner's baked file in place.

Everything before it judges the candidate through the plugin's machinery (parametrized fixtures,
guards, the judge's children); what the reviewer and the user will run is plain `pytest` on the branch.
So a winner is committed only when that run passes, in the user's environment (their variables, their
rlimits), on a fresh seed. The pytest process is a test host: the kernel is served by a jailed kernel
server (`judge/kernel`), never loaded there, so the candidate cannot reach the test process or the
report it writes.
"""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...toolchains import tools
from ..kernel import hosting
from . import environments, files, sandbox
from .plan import Plan

IGNORED = shutil.ignore_patterns(".git", ".kope", "__pycache__", ".pytest_cache")


@dataclass
class PlainRun:
    """How plain `pytest` ended on the file to be committed."""

    passed: int
    failed: list[str] = field(default_factory=list)  # test ids, or why no test result came back
    seconds: float = 0.0
    seed: int = 0

    @property
    def ok(self) -> bool:
        return self.passed > 0 and not self.failed

    def line(self) -> str:
        """One line for the run's output and the report."""
        head = f"plain pytest on the file to be committed (--kope-seed {self.seed}, {self.seconds:.1f} s)"
        if self.ok:
            return f"{head}: {self.passed} passed"
        return f"{head}: {len(self.failed)} failed: {', '.join(self.failed[:5])[:600]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failed": self.failed[:20],
            "seconds": round(self.seconds, 2),
            "seed": self.seed,
        }


def run(
    plan: Plan,
    source: Path,
    text: str,
    top: Path | None = None,
    commit: str | None = None,
    env: Mapping[str, str] | None = None,
) -> PlainRun:
    """Plain `pytest` on `plan.files` in a copy of the tree (`commit` of the git repository at `top`,
    else the rootdir as it is) with `text` as `source`, in the user's environment (plus `env`: e.g.
    the build held to the baseline instruction set, `toolchains/flagblock.py`), its kernel served."""
    seed = random.SystemRandom().randrange(1 << 31)
    work = Path(tempfile.mkdtemp(prefix=f"kope-plain-{plan.operator.name}-"))
    try:
        tree = work / "tree"
        if top is not None and commit is not None:
            _export(top, commit, tree)
        else:
            top = Path(plan.rootdir)
            shutil.copytree(top, tree, ignore=IGNORED)

        def moved(path: Path) -> Path:
            return tree / Path(path).resolve().relative_to(top.resolve())

        root = moved(plan.rootdir)
        moved(source).write_text(text)
        report = work / "plain.xml"
        cmd = [sys.executable, "-m", "pytest", *(str(moved(f)) for f in plan.files), "-q"]
        cmd += ["--kope-seed", str(seed), "--junitxml", str(report), "--rootdir", str(root)]
        cmd += ["-c", str(moved(plan.inifile))] if plan.inifile else []
        users = {**environments.settings(environments.USER), **(env or {})}
        scrubbed = sandbox.scrubbed_environment(
            {
                **users,
                hosting.USER_ENV: hosting.user_environment(users),
                hosting.JAIL_ENV: "1" if sandbox.bubblewrap()[0] else "0",
                hosting.ENV: "1",
                hosting.CALL_TIMEOUT_ENV: str(plan.limits.wall_s),
                tools.JAIL_ENV: "1" if sandbox.bubblewrap()[0] else "0",
            },
            work,
        )
        place = sandbox.Placement(cwd=root, host=True)
        started = sandbox.start(cmd, work, scrubbed, plan.limits, plan.children, place)
        finished = sandbox.wait(started, plan.limits.wall_s)
        outcome = _read(report, finished)
        outcome.seconds, outcome.seed = finished.wall_s, seed
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _export(top: Path, commit: str, into: Path) -> None:
    """The tree of `commit` (what a branch on it holds), without the repository."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=top, capture_output=True, check=True
    )
    into.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def _read(report: Path, finished: sandbox.Finished) -> PlainRun:
    """Passed and failed tests from pytest's JUnit XML; a run that left none failed as a whole."""
    tail = finished.output.strip().splitlines()[-1:] or [""]
    if finished.timed_out:
        return PlainRun(0, [f"no result after {finished.wall_s:.0f} s (wall-clock limit)"])
    try:
        cases = list(ET.fromstring(files.read_bytes(report)).iter("testcase"))
    except (OSError, ET.ParseError):
        return PlainRun(0, [f"pytest left no report (exit status {finished.returncode}): {tail[0][:300]}"])
    passed, failed = 0, []
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif case.find("skipped") is None:
            passed += 1
    if finished.returncode not in (0, 1) and not failed:  # interrupted, crashed, internal error
        failed.append(f"pytest exit status {finished.returncode}: {tail[0][:300]}")
    return PlainRun(passed, failed)
