"""Fixtures shared by the plugin's tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from op_repos import make_op_repo


@pytest.fixture
def op_repo(pytester: pytest.Pytester) -> Path:
    return make_op_repo(pytester.path)
