"""`pytest --kope-check` (and `kope doctor`): what pytest-kope sees in a repo, before any optimizing.

For each operator: its toolchain and whether it is available, its sources and include directories,
which tests judge correctness and which time it, which take fresh inputs, and whether the committed
kernel passes its correctness tests in a judging child (the same path an optimize run takes, with the
differential check's recording). The run's header already says which isolation candidates get.

Whatever a user got wrong (a `kope:` header line, a kernel that does not build, a test module that
does not import) is said under the table, per operator, in the words an optimize run uses, and the
other operators are still checked: no traceback.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tabulate import tabulate

from .buildhints import first_error, include_hint, missing_header
from .errors import KopeError
from .judge.controller.runner import Judge
from .judge.outcome import Outcome
from .operator import is_performance_test
from .session.planning import plan_for

if TYPE_CHECKING:
    from .judge.outcome import Judged
    from .operator import Operator
    from .session.run import OperatorRun, Run

READY = "passes"
_LONGEST = 600  # characters of a failure shown on its one line


def check(kope: Run, operators: list[OperatorRun]) -> int:
    """Print the table and what stands in each operator's way; returns how many operators, and test
    modules that could not be collected, stand in the way of optimizing."""
    if kope.vcs is None:
        kope.say(_no_commit_line(kope), red=True)
    rows, problems = [], []
    for run in operators:
        row, lines = _check_one(kope, run)
        rows.append(row)
        problems += [f"kope {run.op.name}: {_near(line, kope.home)}" for line in lines]
    if rows:
        kope.say(tabulate(rows, headers="keys", tablefmt="simple"))
    uncollected = _uncollected(kope)
    for line in (*problems, *uncollected):
        kope.say(line, red=True)
    broken = len([row for row in rows if row["committed kernel"] != READY])
    if not rows and not uncollected:
        kope.say('kope: no collected test has a `kope` marker: see "Declaring an operator" in the README')
    untimed = len([r for r in rows if r["committed kernel"] == READY and not _timed(r["performance"])])
    kope.say(
        f"kope: {len(rows)} operator(s), {len(rows) - broken} ready to optimize"
        + (f" ({untimed} of them not timed: nothing to commit)" if untimed else "")
        + (f", {broken} not" if broken else "")
        + (f", {len(uncollected)} test module(s) not collected" if uncollected else "")
        + (": see above" if broken or uncollected else "")
    )
    return broken + len(uncollected)


def _check_one(kope: Run, run: OperatorRun) -> tuple[dict[str, Any], list[str]]:
    """The operator's row, and the lines that say what is wrong with it (none when it passes)."""
    op = run.op
    correctness = [i for i in run.items if not is_performance_test(i)]
    row: dict[str, Any] = {
        "operator": op.name,
        "toolchain": op.toolchain,
        "sources": ", ".join(p.name for p in (op.source, *op.companions)),
        "includes": ", ".join(_shown(p, kope.home) for p in op.includes) or "-",
        "built by": _built_by(op),
        "correctness": len(correctness),
        "performance": len(run.items) - len(correctness),
        "fresh inputs": f"{len([i for i in correctness if _fresh(i)])} of {len(correctness)}",
    }
    try:
        verdict, lines = _judge(kope, run, row)
    except Exception as e:  # expected (a KopeError) or not, one operator's failure is its own line
        said = str(e) if isinstance(e, KopeError) else f"{type(e).__name__}: {e}"
        verdict, lines = "cannot judge: see below", [_flat(said)]
    row["committed kernel"] = verdict
    return row, lines


def _judge(kope: Run, run: OperatorRun, row: dict[str, Any]) -> tuple[str, list[str]]:
    """Judge the committed kernel as an optimize run's baseline: (the table's verdict, lines to say)."""
    op = run.op
    plan, tc = plan_for(kope, run)
    timer = tc.timer()
    notes = []
    if not timer.can_time:
        row["performance"] = f"{len(plan.performance)} (not timed: {timer.why_not})"
    elif not plan.performance:
        notes.append(
            "no performance test (a test that takes `kope_bench`): a run judges candidates but times"
            " none, so it commits nothing"
        )
    judge = Judge(plan, tc.screen)
    try:
        base = judge.baseline(op.baseline())
    finally:
        judge.close()
    notes += base.notes
    if base.outcome.correct:
        return READY, notes
    return f"{base.outcome.value}: see below", [*_failure(kope, run, base), *notes]


def _failure(kope: Run, run: OperatorRun, base: Judged) -> list[str]:
    """Why the committed kernel fails: a build's first compiler error whole (with a hint for a header
    it cannot find), else the first failure on one line."""
    op, text = run.op, (base.failures or ["?"])[0]
    if base.outcome != Outcome.COMPILE_FAILED:
        return [f"{base.outcome.value}: {_flat(text)}"]
    names = {p.name: _shown(p, kope.home) for p in (op.source, *op.companions)}
    lines = [f"does not compile: {first_error(text, names)}"]
    header = missing_header(text)
    if header:
        test_file = Path(str(run.items[0].path))
        ini = Path(str(kope.config.inipath)) if kope.config.inipath else None
        hint = include_hint(header, op.source, kope.home, (op.source.parent, *op.includes), test_file, ini)
        lines += [f"hint: {hint}"] if hint else []
    return lines


def _flat(text: str) -> str:
    """`text` on one line of at most _LONGEST characters, without the judge's `kope: operator X: `."""
    one = " ".join(re.sub(r"^kope: operator [^:]+: ", "", text.strip()).split())
    return one if len(one) <= _LONGEST else one[: _LONGEST - 4] + " ..."


def _uncollected(kope: Run) -> list[str]:
    """One line per test module that could not be collected; pytest's own report of it, the import
    machinery's traceback, becomes that line too."""
    reporter = kope.config.pluginmanager.get_plugin("terminalreporter")
    reports = [
        r for r in getattr(reporter, "stats", {}).get("error", []) if isinstance(r, pytest.CollectReport)
    ]
    lines = []
    for report in reports:
        line = _collect_error(report)
        report.longrepr = line
        lines.append(f"kope: {line}")
    return lines


def _collect_error(report: pytest.CollectReport) -> str:
    """`file:line: cannot collect: Error: message; ...` from a failed collection's report."""
    text = report.longreprtext
    path = report.nodeid.split("::")[0] or "a test module"
    at = re.search(r'File "([^"]+)", line (\d+)', text)  # a SyntaxError points into the module
    own = re.findall(rf"^{re.escape(path)}:(\d+): ", text, re.M)  # the module's deepest frame
    where = f"{_relative(at[1])}:{at[2]}" if at else f"{path}:{own[-1]}" if own else path
    raised = [m for m in re.findall(r"^E\s+(\S.*)$", text, re.M) if re.match(r"[\w.]+(Error|Exception)\b", m)]
    said = [line.strip() for line in text.splitlines() if line.strip()]
    why = raised[-1] if raised else (said[-1] if said else "error")
    return f"{where}: cannot collect: {why}; fix it: the tests in it, and any operator they declare, are not checked"


def _no_commit_line(kope: Run) -> str:
    """Where an optimize run's winners go when no branch can hold them."""
    home = kope.home
    why = kope.no_commit_why
    if not kope.settings.no_commit and any((d / ".git").exists() for d in (home, *home.parents)):
        why = f"the git repository at {home} has no commit yet"
    return (
        f"kope: winners will not be committed to {kope.settings.prefix}<operator> branches here ({why}): "
        f"an optimize run writes each verified winner's file to "
        f"{_shown(kope.kope_base, Path.cwd())}/runs/<run-id>/<operator>/ instead"
    )


def _timed(performance: int | str) -> bool:
    """Whether the table's `performance` cell says a run can time the kernel."""
    return isinstance(performance, int) and performance > 0


def _fresh(item: pytest.Item) -> bool:
    """The judging child's rule (child.py): a test takes fresh inputs when it asks for a seed."""
    return "kope_seed" in getattr(item, "fixturenames", ())


def _shown(path: Path, home: Path) -> str:
    return str(path.relative_to(home)) if path.is_relative_to(home) else str(path)


def _near(line: str, home: Path) -> str:
    """`line` with the repo's absolute paths as the user's shell spells them, from where pytest runs."""
    here = os.path.relpath(home)
    return line.replace(f"{home}{os.sep}", "" if here == "." else f"{here}{os.sep}")


def _relative(path: str) -> str:
    return os.path.relpath(path) if os.path.isabs(path) and path.startswith(os.getcwd()) else path


def _built_by(op: Operator) -> str:
    """Who compiles the kernel after a merge, and so which tuning a winner's branch can carry."""
    if not op.own_build:
        return "pytest-kope (params and flags searched)"
    return f"{op.own_build}: params searched, flags held"
