"""Ascend toolchains: `triton-ascend` (interpreter + lowering gate without an NPU) and `ascendc` (CANN).

On a machine without CANN or an NPU these check detection, the commands a build would run and the
errors; the lowering-gate tests run only where triton-ascend is the installed triton (its own venv).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kope.candidate import Candidate
from pytest_kope.errors import BuildError, SpecError, ToolchainMissing
from pytest_kope.spec import parse_spec
from pytest_kope.toolchains import ascendc, devices
from pytest_kope.toolchains.ascendc import AscendCToolchain
from pytest_kope.toolchains.base import Toolchain
from pytest_kope.toolchains.triton_ascend import TritonAscendToolchain

OPS = Path(__file__).resolve().parent.parent / "sample_ops_triton"
NO_NPU = not devices.npu_devices()["ok"]
NO_CANN = ascendc.cann_home()[0] is None
ASCEND_TRITON = devices.triton_flavour() == "ascend"
HAS_TORCH = devices.importable("torch")

ADD_CPP = """\
// kope: kernel add_custom(x: in, y: in, z: out, n: uint32_t)
// kope: param BLOCK_DIM = 8 | 16
// kope: param TILE = 2048 | 1024
#include "kernel_operator.h"
extern "C" __global__ __aicore__ void add_custom(GM_ADDR x, GM_ADDR y, GM_ADDR z, uint32_t n) {}
"""


@pytest.mark.parametrize("cls", [TritonAscendToolchain, AscendCToolchain])
def test_are_toolchains(cls):
    assert isinstance(cls(), Toolchain)


# -- triton-ascend ------------------------------------------------------------------------------------
@pytest.mark.skipif(not NO_NPU, reason="an Ascend NPU is here")
def test_triton_ascend_detection_says_what_is_absent():
    found, missing = devices.ascend_signs()
    got = TritonAscendToolchain().availability()
    if not HAS_TORCH:
        assert not got.ok and "pip install torch==2.13.0" in got.reason
        return
    if not devices.importable("triton"):
        assert not got.ok and got.reason.startswith(
            "triton-ascend not installed: pip install 'pytest-kope[ascend]'"
        )
        return
    assert got.ok
    assert got.reason.startswith(
        "interpreter + Ascend lowering check" if ASCEND_TRITON else "interpreter only"
    )
    if not ASCEND_TRITON:  # the one command that gets the check
        assert (
            "python -m venv .venv-ascend && .venv-ascend/bin/pip install torch==2.13.0 'pytest-kope[ascend]'"
            in got.reason
        )
    assert "no Ascend NPU here: missing " + ", ".join(missing) in got.reason
    assert TritonAscendToolchain().environment() == {
        "TRITON_INTERPRET": "1",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
    }
    assert TritonAscendToolchain().count_devices() == 0
    assert TritonAscendToolchain().timer().can_time is False


def test_which_triton_without_importing_it():
    import sys

    flavour = devices.triton_flavour()
    assert flavour in (None, "community", "ascend")
    assert (flavour == "ascend") == bool(devices.installed("triton-ascend"))
    assert "torch_npu" not in sys.modules


def test_visible_devices_for_npus():
    env = {"ASCEND_RT_VISIBLE_DEVICES": "4,5,6"}
    assert devices.visible_devices_env(TritonAscendToolchain.device_env_var, 2, env) == {
        "ASCEND_RT_VISIBLE_DEVICES": "6"
    }
    assert devices.visible_devices_env(AscendCToolchain.device_env_var, 0, {}) == {
        "ASCEND_RT_VISIBLE_DEVICES": "0"
    }
    assert devices.visible_devices_env(None, 0, {}) == {}  # a CPU toolchain: no device variable


def _build(tmp_path: Path, text: str, name: str):
    TritonAscendToolchain().prepare_process()
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    return TritonAscendToolchain().build(
        Candidate(text, f"{name}.py", "triton-ascend"), parse_spec(text), tmp_path
    )


@pytest.mark.skipif(not NO_NPU, reason="checks the CPU modes")
def test_softmax_runs_and_lowers(tmp_path):
    text = (OPS / "softmax" / "softmax.py").read_text()
    kernel = _build(tmp_path, text, "softmax")
    import torch

    x = torch.randn(4, 300) * 3
    y = torch.full_like(x, float("nan"))
    kernel.functions["softmax"].raw(x, y, 4, 300)
    assert (y.double() - torch.softmax(x.double(), 1)).abs().max().item() < 1e-6


FP64_SQRT = """\
# kope: kernel norm(x: in, y: out, n)
# kope: param BLOCK = 128
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _norm_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float64)
    tl.store(y_ptr + offs, tl.sqrt(x * x).to(tl.float32), mask=offs < n)


def norm(x, y, n):
    _norm_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
"""


@pytest.mark.skipif(
    not ASCEND_TRITON or not NO_NPU, reason="needs triton-ascend as the installed triton, no NPU"
)
def test_gate_rejects_a_kernel_that_does_not_lower_for_ascend(tmp_path):
    import torch

    kernel = _build(tmp_path, FP64_SQRT, "norm")
    x, y = torch.randn(200), torch.empty(200)
    with pytest.raises(BuildError, match="kernel _norm_kernel does not lower for Ascend") as info:
        kernel.functions["norm"].raw(x, y, 200)
    assert "Expected dtype" in info.value.log and "fp64" in info.value.log  # triton-ascend's own words
    assert "\n" not in str(info.value)  # one line: kernel, target, stage, the first error


@pytest.mark.skipif(ASCEND_TRITON or not NO_NPU, reason="community triton only")
def test_fp64_kernel_runs_without_the_gate_under_community_triton(tmp_path):
    import torch

    kernel = _build(tmp_path, FP64_SQRT, "norm")
    x, y = torch.randn(200), torch.empty(200)
    kernel.functions["norm"].raw(x, y, 200)
    assert torch.allclose(y, x.abs())


# -- ascendc -------------------------------------------------------------------------------------------
@pytest.mark.skipif(not NO_CANN, reason="CANN is installed here")
def test_ascendc_says_cann_is_absent_in_one_line():
    got = AscendCToolchain().availability()
    assert not got.ok
    assert "\n" not in got.reason
    assert got.reason.startswith("CANN not found: ASCEND_HOME_PATH is unset and no set_env.sh under")
    assert "no bisheng or ccec compiler" in got.reason and "source <ascend-toolkit>/set_env.sh" in got.reason
    assert AscendCToolchain().mode() == "missing" and AscendCToolchain().count_devices() == 0


@pytest.mark.skipif(not NO_CANN, reason="CANN is installed here")
def test_ascendc_build_without_cann_is_toolchain_missing(tmp_path):
    with pytest.raises(ToolchainMissing, match="toolchain 'ascendc': CANN not found"):
        AscendCToolchain().build(Candidate(ADD_CPP, "add.cpp", "ascendc"), parse_spec(ADD_CPP), tmp_path)


def test_cann_detection_from_a_toolkit_layout(tmp_path, monkeypatch):
    home = tmp_path / "ascend-toolkit" / "latest"
    bin_dir = home / "compiler" / "ccec_compiler" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "bisheng").write_text("#!/bin/sh\n")
    assert ascendc.cann_home({"ASCEND_HOME_PATH": str(home)}) == (home, f"ASCEND_HOME_PATH={home}")
    assert ascendc.compiler(home, "bisheng") == str(bin_dir / "bisheng")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert ascendc.compiler(home, "ccec") is None


def test_ascendc_command_lines(tmp_path):
    src, out = tmp_path / "src", tmp_path / "src" / "build"
    assert ascendc.build_commands(src, out, jobs=2) == [
        ["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", str(out), "-j", "2"],
    ]
    sourced = ascendc.build_commands(src, out, Path("/opt/ascend-toolkit/set_env.sh"))
    assert sourced[0][:3] == ["bash", "-c", 'source "/opt/ascend-toolkit/set_env.sh" >/dev/null && exec "$@"']
    assert sourced[0][4:] == ["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release"]


def test_ascendc_cmakelists():
    cann = Path("/usr/local/Ascend/ascend-toolkit/latest")
    npu = ascendc.cmakelists("add.cpp", "npu", "Ascend910B2", cann, {"TILE": 2048, "BLOCK_DIM": 8}, "-O3")
    assert 'set(SOC_VERSION "Ascend910B2"' in npu
    assert "${ASCEND_CANN_PACKAGE_PATH}/compiler/tikcpp/ascendc_kernel_cmake" in npu
    assert "include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)" in npu
    assert "ascendc_library(kope_kernels SHARED add.cpp)" in npu
    assert "ascendc_compile_definitions(kope_kernels PRIVATE -DTILE=2048 -DBLOCK_DIM=8)" in npu
    assert "ascendc_compile_options(kope_kernels PRIVATE -O3)" in npu
    cpu = ascendc.cmakelists("add.cpp", "cpu", "Ascend910B2", cann, {"TILE": 1024}, "")
    assert "find_package(tikicpulib REQUIRED)" in cpu
    assert "add_library(kope_kernels SHARED add.cpp kope_cpu_shim.cpp)" in cpu
    assert "tikicpulib::${SOC_VERSION}" in cpu and "TILE=1024" in cpu


def test_ascendc_cpu_debug_shim():
    from pytest_kope.toolchains.pylaunch import parse_kernel

    decl = "add_custom(x: in, y: in, z: out, n: uint32_t)"
    name, args = parse_kernel(decl)
    types = ascendc.scalar_types(decl, "add.cpp")
    assert types == {"n": "uint32_t"}
    shim = ascendc.cpu_shim(name, args, types)
    assert (
        'extern "C" __global__ __aicore__ void add_custom(GM_ADDR x, GM_ADDR y, GM_ADDR z, uint32_t n);'
        in shim
    )
    assert "int kope_cpu_add_custom(uint32_t block_dim, void *x, size_t x_bytes," in shim
    assert "ICPU_RUN_KF(add_custom, block_dim, g_x, g_y, g_z, n);" in shim
    assert "std::memcpy(z, g_z, z_bytes);" in shim and "std::memcpy(x, g_x" not in shim


def test_ascendc_scalars_need_c_types():
    with pytest.raises(SpecError, match="give scalar 'n' a C type, e.g. `n: uint32_t`"):
        ascendc.scalar_types("add_custom(x: in, z: out, n)", "add.cpp")


def test_ascendc_screen():
    bad = (
        ADD_CPP
        + '\nvoid f() { system("id"); FILE *f = fopen("/etc/passwd", "r"); }\n// popen( in a comment\n'
    )
    reasons = AscendCToolchain().screen(Candidate(bad, "add.cpp", "ascendc"))
    assert reasons == [
        "calls fopen() (process/file/network/environment APIs are not allowed in a kernel)",
        "calls system() (process/file/network/environment APIs are not allowed in a kernel)",
    ]
    assert AscendCToolchain().screen(Candidate(ADD_CPP, "add.cpp", "ascendc")) == []


def test_no_device_probe_without_signs(monkeypatch):
    devices.npu_devices.cache_clear()
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    try:
        got = devices.npu_devices()
        assert got["ok"] is False and got["why"].startswith("no Ascend NPU here: missing")
        assert "ASCEND_HOME_PATH" in got["why"]
    finally:
        devices.npu_devices.cache_clear()
    assert os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "0") == "0"
