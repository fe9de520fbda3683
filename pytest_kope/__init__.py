"""pytest-kope: an agent optimizes an operator repo's kernels, with the repo's own tests as the judge."""

from .oracle import assert_close

__all__ = ["assert_close"]
__version__ = "0.1.0"
