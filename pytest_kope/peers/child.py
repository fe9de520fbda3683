"""`--kope-peers`: the verified winner next to its peers, measured in a jailed child after verification.

The controller never loads a kernel: `python -m pytest_kope.peers` runs in the judge's sandbox (its own
folder the only writable path, a scrubbed environment, rlimits and a wall-clock limit) and writes one
JSON object, from which the controller keeps the headline. Informational only: no verdict reads it,
and a child that fails or times out costs the run nothing but the line saying so.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..judge.controller import sandbox
from ..spec import parse_spec
from .cases import CASES

WALL_S = 300.0  # torch.compile's first compile of an operator takes 10-60 s on a loaded 2-core machine


def applies(name: str, committed: str) -> bool:
    """Whether the peers know an operator of this name and prototype."""
    case = CASES.get(name)
    return case is not None and case.matches(tuple(parse_spec(committed).kernels))


def measure(
    name: str,
    committed: Path,
    winner_text: str,
    include: Path,
    rounds: int = 9,
    wall_s: float = WALL_S,
    children: sandbox.Children | None = None,
) -> dict[str, Any]:
    """The child's comparison of the committed kernel and the winner with the peers (its JSON), or
    {"error": why} when the child could not give one; the child is one of the run's `children`."""
    with tempfile.TemporaryDirectory(prefix=f"kope-peers-{name}-") as tmp:
        work = Path(tmp)
        winner = work / "winner" / committed.name
        winner.parent.mkdir()
        winner.write_text(winner_text)
        out = work / "peers.json"
        cmd = [
            sys.executable, "-m", "pytest_kope.peers", "--op", name, "--include", str(include),
            "--kernel", f"committed={committed}", "--kernel", f"winner={winner}",
            "--build-dir", str(work / "build"), "--json", str(out), "--rounds", str(rounds),
        ]  # fmt: skip
        # torch.compile writes its caches under the child's own folder (everything else is read-only)
        # and imports this pytest_kope, wherever the controller found it
        here = str(Path(__file__).resolve().parents[2])
        extra = {"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"), "PYTHONPATH": _path(here)}
        env = sandbox.scrubbed_environment(extra, work)
        limits = sandbox.Limits(wall_s=wall_s, address_space=32 << 30)
        done = sandbox.run(cmd, work, env, limits, children or sandbox.Children())
        if done.timed_out:
            return {"error": f"the peer comparison took longer than {wall_s:.0f} s"}
        if done.returncode != 0 or not out.is_file():
            tail = done.output.strip().splitlines()[-1:] or [""]
            return {"error": f"the peer comparison exited {done.returncode}: {tail[0][:300]}"}
        data: dict[str, Any] = json.loads(out.read_text())
        return data


def _path(first: str) -> str:
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])
