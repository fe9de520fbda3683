"""A `--kope-optimize --kope-agent replay:DIR` run on a copy of some of `sample_ops/`, as a user runs it.

The round-2 adversarial tests (`tests/test_adversarial_*.py`) judge hand-written candidates for the
sample operators themselves (sgemm, rowsum, softmax, ...): `tests/adversarial/round2/<op>/<name>.c`,
each a whole kernel source with the operator's interface. One run judges many candidates at once; a
test reads one candidate's verdict from report.json and the branches from git.

A trick's gain is measured against its own file with the trick switched off (`switched_off`),
committed in the operator's place: the same machine code but one data word. Code placement alone
moved the same plain sgemm loops 2x on a Zen 3 (one more PLT entry shifted the hot loop), so only the
same bytes say that a trick gained nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from op_repos import UNJAILED, git

SAMPLE_OPS = Path(__file__).resolve().parent.parent / "sample_ops"
ROUND2 = Path(__file__).resolve().parent / "adversarial" / "round2"


ARMED, DISARMED = "static volatile int armed = 1;", "static volatile int armed = 0;"


def switched_off(op: str, name: str, tricks: Path = ROUND2) -> str:
    """`<op>/<name>.c` with its trick switched off: its `armed` flag cleared, its code unchanged."""
    text = (tricks / op / f"{name}.c").read_text()
    assert text.count(ARMED) == 1, f"{op}/{name}.c declares no `{ARMED}` to switch its trick off"
    return text.replace(ARMED, DISARMED)


class ReplayRun:
    """One optimize run over the named candidates of each operator, and what its tests read."""

    def __init__(
        self,
        root: Path,
        candidates: dict[str, list[str]],
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
        tricks: Path = ROUND2,
        committed: dict[str, str] | None = None,
    ):
        """`committed`: kernel sources written over some operators' own `<op>/<op>.c`."""
        committed = committed or {}
        self.repo = root / "ops"
        self.repo.mkdir(parents=True)
        shutil.copy(SAMPLE_OPS / "pytest.ini", self.repo / "pytest.ini")
        agent = root / "agent"
        for op, names in candidates.items():
            shutil.copytree(SAMPLE_OPS / op, self.repo / op)
            if op in committed:
                (self.repo / op / f"{op}.c").write_text(committed[op])
            (agent / op).mkdir(parents=True)
            for name in names:
                shutil.copy(tricks / op / f"{name}.c", agent / op / f"{name}.c")
                sidecar = tricks / op / f"{name}.json"  # params and idea, when the candidate has them
                if sidecar.exists():
                    shutil.copy(sidecar, agent / op / sidecar.name)
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-qm", "operators")
        env = {**os.environ, **(extra_env or {})}
        env.pop("PYTEST_ADDOPTS", None)
        budget = max(len(n) for n in candidates.values())
        cmd = [sys.executable, "-m", "pytest", "--kope-optimize", f"--kope-agent=replay:{agent}"]
        cmd += ["--kope-budget", str(budget), "--kope-timeout", "60", "-p", "no:cacheprovider"]
        cmd += [*UNJAILED, *extra_args]
        self.proc = subprocess.run(cmd, cwd=self.repo, env=env, capture_output=True, text=True, timeout=1200)
        self.output = self.proc.stdout + self.proc.stderr
        reports = sorted((self.repo / ".kope" / "runs").glob("*/report.json"))
        assert reports, f"no report was written\n{self.output[-4000:]}"
        self.report: dict[str, Any] = json.loads(reports[-1].read_text())
        self.ops: dict[str, dict[str, Any]] = {o["name"]: o for o in self.report["operators"]}

    def verdict(self, op: str, name: str) -> dict[str, Any]:
        """The judged candidate replayed from `<op>/<name>.c`."""
        c: dict[str, Any]
        for c in self.ops[op].get("candidates", []):
            if re.match(rf"replayed {re.escape(name)}\.c\b", c.get("idea", "")):
                return c
        judged = [c.get("idea") for c in self.ops[op].get("candidates", [])]
        raise AssertionError(f"{op}/{name} was not judged; judged: {judged}\n{self.output[-3000:]}")

    def crowned(self, op: str, name: str) -> bool:
        """Whether `<op>/<name>.c` is the operator's verified best (committed unless --kope-no-commit)."""
        entry = self.ops[op]
        return bool(entry["verified"]) and entry["best"]["id"] == self.verdict(op, name)["id"]

    def why(self, op: str, name: str) -> str:
        """Why `<op>/<name>.c` was or was not crowned, whole (pytest cuts a verdict dict short)."""
        v, entry = self.verdict(op, name), self.ops[op]
        said = {k: v.get(k) for k in ("outcome", "reason", "failures", "notes", "ratio_low")}
        crown = {k: entry.get(k) for k in ("verified", "best", "note", "plain_pytest")}
        return f"{op}/{name}: {said}\n{op}: {crown}\n{self.output[-2500:]}"

    def committed_source(self, op: str) -> str | None:
        """The kernel source on `kope/<op>`, or None when no branch was made."""
        branches = git(self.repo, "for-each-ref", "--format=%(refname:short)", f"refs/heads/kope/{op}")
        if not branches.strip():
            return None
        return subprocess.run(
            ["git", "show", f"kope/{op}:{op}/{op}.c"], cwd=self.repo, capture_output=True, text=True
        ).stdout
