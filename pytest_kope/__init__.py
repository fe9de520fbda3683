"""pytest-kope: an agent optimizes an operator repo's kernels, with the repo's own tests as the judge."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .oracle import assert_close

__all__ = ["assert_close"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """`assert_close` on first use: a kernel server imports this package and never numpy."""
    if name == "assert_close":
        from .oracle import assert_close

        return assert_close
    raise AttributeError(f"module 'pytest_kope' has no attribute {name!r}")
