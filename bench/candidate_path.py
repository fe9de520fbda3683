"""How far one candidate travels through the controller: the files it enters, its stays, its names.

Issue 37 asked that a newcomer can follow one candidate from `pytest_runtestloop` to a commit. This
measures that way for the run's winner: one sample operator (default rowsum) is copied into a
temporary git repo and optimized in this process (`--kope-optimize --kope-agent tuner`, commits on),
with a profiler on every thread. At each call of a pytest_kope function, the arguments that hold
the candidate (the `Candidate`, or a `Judged` wrapping it, matched by its hash) are noted. Then:

- files: the pytest_kope modules whose functions received it;
- stays: maximal runs of consecutive such calls in one file (entering a file again is a new stay);
- names: the distinct parameter names it was passed under (a method of its own, called on it as
  `self`, is not a way it travels).

Only the controller is traced: what the jailed child does with the candidate's build is another
process. The same script measures an older checkout when run with that checkout importable.

    python bench/candidate_path.py [--op rowsum] [--budget 3]   # JSON: bench/results/candidate_path.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
HOLDERS = ("Candidate", "Judged")  # the types a candidate travels as in the controller


class Tracer:
    """A profile function that notes each pytest_kope call receiving a candidate, in call order."""

    def __init__(self, package: Path):
        self.package = str(package)
        self.calls: list[tuple[str, str, str, str]] = []  # (file, function, parameter, candidate hash)
        self.lock = threading.Lock()

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(self.package):
            return
        code = frame.f_code
        params = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        for name in params[1:] if params[:1] == ("self",) else params:  # its own methods: not a way
            h = _hash_of(frame.f_locals.get(name))
            if h:
                where = os.path.relpath(code.co_filename, os.path.dirname(self.package))
                with self.lock:
                    self.calls.append((where, code.co_name, name, h))


def _hash_of(value: object) -> str:
    kind = type(value).__name__
    if kind == "Judged":
        value = getattr(value, "candidate", None)
        kind = type(value).__name__
    if kind != "Candidate":
        return ""
    try:
        return str(getattr(value, "hash", ""))
    except Exception:  # a half-made candidate: not one to follow
        return ""


def make_repo(root: Path, op: str) -> Path:
    repo = root / "ops"
    shutil.copytree(ROOT / "sample_ops" / op, repo / op)
    shutil.copy(ROOT / "sample_ops" / "pytest.ini", repo / "pytest.ini")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "ops"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def trace_run(op: str, budget: int, seed: int) -> tuple[Tracer, dict[str, Any]]:
    """Optimize `op` in this process with the tracer on; the tracer and the operator's report entry."""
    import pytest_kope

    tracer = Tracer(Path(pytest_kope.__file__).parent)
    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repo(Path(tmp), op)
        before = Path.cwd()
        os.chdir(repo)
        args = ["--kope-optimize", "--kope-agent", "tuner", "--kope-budget", str(budget)]
        args += ["--kope-seed", str(seed), "-q", "-p", "no:cacheprovider"]
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            pytest.main(args)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            os.chdir(before)
        reports = sorted((repo / ".kope" / "runs").glob("*/report.json"))
        entry = json.loads(reports[-1].read_text())["operators"][0] if reports else {}
    return tracer, entry


def the_way(tracer: Tracer, entry: dict[str, Any]) -> dict[str, Any]:
    """Files, stays and names of the winner (or, with none verified, the best candidate judged)."""
    best = str((entry.get("best") or {}).get("id", ""))
    calls = [c for c in tracer.calls if best and c[3].startswith(best)]
    stays: list[str] = []
    way: list[list[str]] = []  # per stay, the functions it was passed to there, as `function(name)`
    for file, function, name, _ in calls:
        if not stays or stays[-1] != file:
            stays.append(file)
            way.append([])
        way[-1].append(f"{function}({name})")
    entered = Counter(stays)
    return {
        "candidate": best,
        "verified": bool(entry.get("verified")),
        "files": len(entered),
        "stays": len(stays),
        "names": sorted({name for _, _, name, _ in calls}),
        "calls": len(calls),
        "entered": dict(entered.most_common()),
        "way": [f"{file}: {' '.join(functions)}" for file, functions in zip(stays, way)],
    }


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--op", default="rowsum")
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "candidate_path.json")
    a = parser.parse_args(argv)
    way = the_way(*trace_run(a.op, a.budget, a.seed))
    entered: dict[str, int] = way["entered"]
    rows = [[file, n] for file, n in entered.items()]  # most entered first (a Counter's order)
    print(tabulate(rows, headers=["file", "stays"]))
    print(
        f"{a.op}: candidate {way['candidate']} (verified: {way['verified']}): {way['files']} files,"
        f" {way['stays']} stays, {len(way['names'])} names, {way['calls']} calls"
    )
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"operator": a.op, "budget": a.budget, **way}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
