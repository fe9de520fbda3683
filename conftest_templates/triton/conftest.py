"""conftest.py for a Triton operator repo (pytest-kope `triton` toolchain)."""

import os

import pytest

from pytest_kope.toolchains.triton import TritonToolchain

# Must run before any test module imports triton: without a GPU, Triton runs in its CPU interpreter
# (correctness only), which TRITON_INTERPRET=1 switches on at `import triton`.
TritonToolchain().prepare_process()


@pytest.fixture
def device():
    """Where test tensors live: "cuda" on a GPU, "cpu" under the interpreter."""
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
        return "cuda"
    return "cpu"
