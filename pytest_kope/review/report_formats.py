"""The run's report files, one per registered format: `FORMATS` maps a file name in the run's folder
(`.kope/runs/<run-id>/`) to the function that renders the run's data as that file's text.

Adding a format is one function and one line here (or `FORMATS["report.csv"] = render` from a plugin).
A format renders report.json's data, plain dicts (its operators as `OperatorSummary.to_json()` writes
them): plugins' formats are written against that shape; report.md reads the operators back typed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report_md import markdown


def as_json(data: dict[str, Any]) -> str:
    """report.json: everything, matching schemas/report.schema.json."""
    return json.dumps(data, indent=1, default=str)


FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {
    "report.json": as_json,
    "report.md": markdown,  # for people
}


def write(run_dir: Path, data: dict[str, Any], extra_json: str | None = None) -> list[Path]:
    """Every registered format into the run's folder, and the JSON also at `extra_json` (--kope-report)
    when given; the paths written, in registry order."""
    paths = []
    for name, render in FORMATS.items():
        path = Path(run_dir) / name
        path.write_text(render(data))
        paths.append(path)
    if extra_json:
        Path(extra_json).write_text(as_json(data))
    return paths


def said(paths: list[Path]) -> str:
    """'a, b and c'."""
    names = [str(p) for p in paths]
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
