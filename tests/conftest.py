"""Fixtures shared by the plugin's tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy  # noqa: F401 - loaded before pytester's in-process runs, which drop modules they load: numpy cannot load twice
import pytest
from op_repos import make_op_repo

from pytest_kope.review.report import report_schema


@pytest.fixture
def op_repo(pytester: pytest.Pytester) -> Path:
    return make_op_repo(pytester.path)


@pytest.fixture(autouse=True)
def every_report_matches_its_schema(request: pytest.FixtureRequest):
    """After each test that ran pytest in a pytester dir: every report.json its runs wrote
    (`.kope/runs/<run-id>/report.json`) matches pytest_kope/schemas/report.schema.json."""
    roots = [request.getfixturevalue("pytester").path] if "pytester" in request.fixturenames else []
    yield
    for root in roots:
        check_reports(root)


@pytest.fixture(autouse=True, scope="session")
def every_session_report_matches_its_schema(tmp_path_factory: pytest.TempPathFactory):
    """The same at the end, for runs made in shared tmp dirs (module-scoped runs, tmp_path_factory)."""
    yield
    check_reports(tmp_path_factory.getbasetemp())


def check_reports(root: Path) -> int:
    reports = [p for p in root.rglob("report.json") if p.parent.parent.name == "runs"]
    if not reports:
        return 0
    import jsonschema  # the [test] extra's; modules that write no report (the Ascend ones) run without it

    validator = jsonschema.Draft202012Validator(report_schema())
    for path in reports:
        errors = sorted(validator.iter_errors(json.loads(path.read_text())), key=str)
        assert not errors, f"{path} does not match report.schema.json: {errors[0].message}"
    return len(reports)
