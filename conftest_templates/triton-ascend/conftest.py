"""conftest.py for a Triton-on-Ascend operator repo (pytest-kope `triton-ascend` toolchain, selected
for every `.py` operator by `kope_toolchain = triton-ascend` in pytest.ini)."""

import pytest

from pytest_kope.toolchains import for_suffix

TOOLCHAIN = None


@pytest.hookimpl(trylast=True)  # after pytest-kope has registered its toolchains
def pytest_configure(config):
    """Before any test module imports torch or triton. Without an NPU this sets TRITON_INTERPRET=1 (the
    CPU interpreter; every kernel launch is also lowered for Ascend as far as triton-ascend goes
    without CANN) and TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch_npu without CANN breaks `import torch`)."""
    global TOOLCHAIN
    TOOLCHAIN = for_suffix(config, ".py")
    if TOOLCHAIN.prepare_process() == "npu":
        import torch_npu  # noqa: F401  (registers the "npu" device)


@pytest.fixture
def device():
    """Where test tensors live: "npu" on an Ascend NPU, else "cpu"."""
    pytest.importorskip("torch")
    return TOOLCHAIN.device()
