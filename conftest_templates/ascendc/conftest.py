"""conftest.py for an Ascend C operator repo (pytest-kope `ascendc` toolchain, CANN)."""

import os

import pytest

from pytest_kope.toolchains.ascendc import AscendCToolchain

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
MODE = AscendCToolchain().mode()  # "npu", "cpu-debug" (CANN, no NPU) or "missing"


@pytest.fixture
def device():
    """Where test data lives: "npu" (torch_npu tensors), or "cpu" (CPU-debug mode takes numpy arrays)."""
    if MODE == "missing":
        pytest.skip(AscendCToolchain().availability().reason)
    if MODE == "npu":
        import torch_npu  # noqa: F401

        return "npu"
    return "cpu"
