"""Shared set-up of this operator repo: the mode of the Triton toolchain the run builds `.py` kernels
with (`triton`, or `triton-ascend` with `--kope-toolchain triton-ascend`), and where tensors live."""

import pytest

from pytest_kope.toolchains import for_suffix

TOOLCHAIN = None


@pytest.hookimpl(trylast=True)  # after pytest-kope has registered its toolchains
def pytest_configure(config):
    """Before any test module imports triton: without a GPU or NPU, Triton runs in its CPU
    interpreter, which must be switched on (TRITON_INTERPRET=1) before `import triton`."""
    global TOOLCHAIN
    TOOLCHAIN = for_suffix(config, ".py")
    if TOOLCHAIN.prepare_process() == "npu":
        import torch_npu  # noqa: F401  (registers the "npu" device)


@pytest.fixture
def device():
    """Where test tensors live: "cuda" on a usable GPU, "npu" on an Ascend NPU, else "cpu"."""
    pytest.importorskip("torch")
    return TOOLCHAIN.device()
