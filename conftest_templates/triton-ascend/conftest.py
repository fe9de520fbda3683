"""conftest.py for a Triton-on-Ascend operator repo (pytest-kope `triton-ascend` toolchain)."""

import pytest

from pytest_kope.toolchains.triton_ascend import TritonAscendToolchain

# Before any test module imports torch or triton. Without an NPU this sets TRITON_INTERPRET=1 (CPU
# interpreter; each launch is also lowered for Ascend as far as triton-ascend goes without CANN) and
# TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch_npu without CANN would break `import torch`).
MODE = TritonAscendToolchain().prepare_process()
if MODE == "npu":
    import torch_npu  # noqa: F401  (registers the "npu" device)


@pytest.fixture
def device():
    """Where test tensors live: "npu" on an Ascend NPU, else "cpu"."""
    pytest.importorskip("torch")
    return "npu" if MODE == "npu" else "cpu"
