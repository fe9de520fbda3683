"""The one place a `KopeError` becomes a pytest error.

Core modules raise domain errors (errors.py) named for the condition; the hooks and fixtures that
pytest calls wrap their work in `border()`, which turns them into `pytest.UsageError` with the same
message, or, around a test's own kernel, in `failing()`, which fails that test. This module imports
nothing else of the session, so a plain run pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ..errors import KopeError


@contextmanager
def border() -> Iterator[None]:
    """Run a hook's work; a `KopeError` leaves as a `pytest.UsageError` with its message."""
    try:
        yield
    except KopeError as e:
        raise pytest.UsageError(str(e)) from None


@contextmanager
def failing() -> Iterator[None]:
    """Run a test's fixture work; a `KopeError` fails that test with its message (no traceback)."""
    try:
        yield
    except KopeError as e:
        pytest.fail(str(e), pytrace=False)
