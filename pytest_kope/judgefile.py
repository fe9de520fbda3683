"""`kope judge OP FILE [pytest args]`: one candidate file judged exactly as an optimize run judges it.

How a user checks a hand-written kernel, and on a CPU the way to judge a Triton candidate's
correctness at all. It *is* an optimize run: `pytest --kope-optimize` on the operator alone, with the
replay agent proposing FILE once (budget 1), nothing committed. So the screen, the build in the
jail, the operator's tests in both environments, the differential check, the timing where the
hardware allows and the verification of a winner are the run's own.

It judges that file and nothing else: the run keeps its own experience graph in a temporary folder,
so it neither resumes from the best attempt the repo's graph knows (an earlier winner would be judged
in the file's place) nor skips a file judged before, and the file never becomes a later search's
starting point or winner. Prints the verdict with one set of figures (the verified winner's, as the
run's table has them); exit 0 only when the file passed (and, where it is timed, is a verified
winner), 1 when not, 2 when it could not be judged.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .review.summary import OperatorSummary

USAGE = "usage: kope judge OPERATOR FILE [pytest args, e.g. the repo's path]"


def main(argv: Sequence[str]) -> int:
    """Judge FILE for operator OP in a run of its own; the verdict's exit status."""
    if len(argv) < 2 or argv[0].startswith("-") or argv[1].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    op, source, rest = argv[0], Path(argv[1]), list(argv[2:])
    if not source.is_file():
        print(
            f"kope judge: cannot read {source}: no such file; give the candidate's kernel source",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="kope-judge-") as tmp:
        folder = Path(tmp) / "candidates" / op
        folder.mkdir(parents=True)
        shutil.copy(source, folder / source.name)
        if source.with_suffix(".json").is_file():  # its params, as the replay agent reads them
            shutil.copy(source.with_suffix(".json"), folder / f"{source.stem}.json")
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pytest", "--kope-optimize", f"--kope-agent=replay:{folder.parent}"]
        cmd += ["--kope-operator", op, "--kope-budget", "1", "--kope-no-commit", "--kope-report", str(report)]
        cmd += ["--kope-db", str(Path(tmp) / "experience.db")]  # its own graph: see the docstring
        code = subprocess.call([*cmd, *rest])
        if not report.is_file():
            print(
                f"kope judge: the run ended (pytest exit {code}) before judging {source}; see above",
                file=sys.stderr,
            )
            return 2
        data = json.loads(report.read_text())
    return _say(op, source, data)


def _say(op: str, source: Path, data: dict[str, Any]) -> int:
    entry = next(
        (OperatorSummary.from_json(o) for o in data.get("operators", []) if o.get("name") == op), None
    )
    judged = [c for c in ((entry.candidates or []) if entry else []) if c.get("agent") == "replay"]
    if entry is None or not judged:
        why = (entry.note if entry else None) or "the operator was not run"
        print(f"kope judge: {op}: {source} was not judged: {why}", file=sys.stderr)
        return 2
    verdict, timed = judged[0], entry.baseline_s is not None
    reason = verdict.get("reason", "")
    if timed:
        good = verdict["outcome"] == "better" and entry.verified and entry.speedup is not None
        if good:  # the verification's figures, the table's: the search's own ratio is not printed
            reason = (
                f"verified in fresh processes: {entry.speedup:.2f}x faster than the committed kernel"
                f" ({_ms(entry.baseline_s)} -> {_ms(entry.best_s)})"
            )
        elif verdict["outcome"] == "better":
            reason = f"faster in the search, not verified: {entry.note or ''}"
        also = ""
    else:
        good = verdict["outcome"] in ("ok", "better")
        also = f"; not timed: {(entry.stopped or {}).get('detail', 'this machine cannot time it')}"
    print(f"kope judge: {op} {source}: {verdict['outcome']}: {reason}{also}")
    return 0 if good else 1


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.4g} ms"
