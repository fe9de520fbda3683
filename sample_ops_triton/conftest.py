"""Shared set-up of this operator repo: Triton's mode, and where tensors live."""

import os

import pytest

from pytest_kope.toolchains.triton import TritonToolchain

# Before any test module imports triton: without a GPU, Triton runs in its CPU interpreter, which
# must be switched on (TRITON_INTERPRET=1) before `import triton`.
TritonToolchain().prepare_process()


@pytest.fixture
def device():
    """Where test tensors live: "cuda" on a usable GPU (unless TRITON_INTERPRET=1), else "cpu"."""
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available():
        return "cuda"
    return "cpu"
