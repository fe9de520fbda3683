"""A second run that finds only the winner an earlier run committed says so: the closing line counts
it as verified again, never as a new winner, and the report names the branch it is already on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from op_repos import UNJAILED
from replay_run import ReplayRun


def test_an_earlier_winner_verified_again_is_not_a_new_winner(tmp_path: Path) -> None:
    first = ReplayRun(tmp_path, {"rowsum": ["plain_twin"]})
    assert first.crowned("rowsum", "plain_twin"), first.why("rowsum", "plain_twin")
    assert "1 verified winner" in first.output.splitlines()[-1]
    cmd = [sys.executable, "-m", "pytest", "--kope-optimize", f"--kope-agent=replay:{tmp_path / 'agent'}"]
    cmd += ["--kope-budget", "1", "-p", "no:cacheprovider", *UNJAILED]
    again = subprocess.run(cmd, cwd=first.repo, capture_output=True, text=True, timeout=900)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert "0 verified winners" in last and "1 earlier winner verified again (already committed)" in last, (
        last
    )
    report = json.loads(sorted((first.repo / ".kope" / "runs").glob("*/report.json"))[-1].read_text())
    (op,) = report["operators"]
    assert op["verified"] and op["already_committed"]["branch"] == "kope/rowsum", op
