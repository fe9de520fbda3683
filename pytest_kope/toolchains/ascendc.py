"""The `ascendc` toolchain: Ascend C kernels built with CANN and called directly (kernel direct call).

A source is one Ascend C kernel file (``.cpp``) whose ``__global__ __aicore__`` function is declared
in its header, with typed scalars (the call crosses into C)::

    // kope: kernel softmax_custom(x: in, y: out, rows: uint32_t, cols: uint32_t)
    // kope: param BLOCK_DIM = 8 | 16 | 20 | 40     the launch's blockDim (required)
    // kope: param TILE = 2048 | 1024 | 4096        any other param: a -D definition
    // kope: flags -O2 | -O3                        optional compile options

Build, following CANN's kernel-launch samples: a generated CMakeLists.txt includes CANN's
``ascendc.cmake`` (``<cann>/compiler/tikcpp/ascendc_kernel_cmake``, older: ``tools/tikcpp/...``) and
``ascendc_library(kope_kernels SHARED softmax.cpp)``, which compiles with bisheng/ccec and exports
``aclrtlaunch_<kernel>(blockDim, stream, args...)``; pytest-kope loads that with cffi and passes
torch_npu tensors' device pointers and the current NPU stream. Where CANN is installed but there is no
NPU, the CPU-debug mode links the kernel with ``tikicpulib`` and a generated shim that copies numpy
arrays into ``GmAlloc`` buffers and runs ``ICPU_RUN_KF`` (correctness only, no timing).

None of this can run without CANN: on such a machine `availability()` says what is missing, in one
line, and `build()` raises `ToolchainMissing`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..errors import BuildError, SpecError, ToolchainMissing
from ..hardware import cpu_fingerprint
from ..spec import FLAGS, KernelSpec, Scalar, bake_defaults
from . import devices
from .base import IN, INOUT, OUT, SCALAR, Arg, Availability, Kernel, KernelFunction, Timer, ToolchainBase
from .cdefines import write_defines
from .pylaunch import kernel_args, parse_kernel
from .screening import screen_c_source

DEFAULT_SOC = "Ascend910B2"
TOOLKIT_ROOTS = ("/usr/local/Ascend/ascend-toolkit", "~/Ascend/ascend-toolkit")
SCALAR_TYPES = frozenset(
    {
        "int8_t",
        "uint8_t",
        "int16_t",
        "uint16_t",
        "int32_t",
        "uint32_t",
        "int64_t",
        "uint64_t",
        "float",
        "double",
        "int",
        "bool",
        "size_t",
    }
)
_DECL_TYPES = re.compile(r"(\w+)\s*:\s*(\w+)")


def cann_home(environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """(CANN toolkit directory or None, how it was found or what is missing), without side effects."""
    env = os.environ if environ is None else environ
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        if env.get(var):
            return Path(env[var]), f"{var}={env[var]}"
    for root in TOOLKIT_ROOTS:
        base = Path(root).expanduser()
        if (base / "set_env.sh").is_file() and (base / "latest").is_dir():
            return base / "latest", f"{base}/set_env.sh (not sourced)"
    return None, "ASCEND_HOME_PATH is unset and no set_env.sh under " + " or ".join(TOOLKIT_ROOTS)


def compiler(home: Path | None, name: str) -> str | None:
    """Path of a CANN compiler (`bisheng`, `ccec`): on PATH, or in the toolkit's ccec_compiler/bin."""
    found = shutil.which(name)
    if found:
        return found
    if home is not None:
        for sub in ("compiler/ccec_compiler/bin", "ccec_compiler/bin", "bin"):
            path = home / sub / name
            if path.is_file():
                return str(path)
    return None


def scalar_types(decl: str, where: str) -> dict[str, str]:
    """C types of the scalar arguments of an ascendc kernel declaration; each must be spelled out."""
    named = dict(_DECL_TYPES.findall(decl))
    out = {}
    for arg in parse_kernel(decl, where=where)[1]:
        if arg.role != SCALAR:
            continue
        kind = named.get(arg.name, "")
        if kind not in SCALAR_TYPES:
            raise SpecError(
                f"{where}: give scalar {arg.name!r} a C type, e.g. `{arg.name}: uint32_t` "
                f"(one of {', '.join(sorted(SCALAR_TYPES))}); got {kind or 'none'}"
            )
        out[arg.name] = kind
    return out


def cmakelists(
    source: str, mode: str, soc: str, cann: Path, defines: Mapping[str, Scalar], options: str
) -> str:
    """The CMakeLists.txt of one build: `mode` "npu" (ascendc_library) or "cpu" (tikicpulib, with shim)."""
    defs = " ".join(f"-D{k}={v}" for k, v in defines.items())
    head = (
        "cmake_minimum_required(VERSION 3.16)\n"
        "project(kope_ascendc LANGUAGES CXX)\n"
        f'set(SOC_VERSION "{soc}" CACHE STRING "system on chip type")\n'
        f'set(ASCEND_CANN_PACKAGE_PATH "{cann}" CACHE PATH "CANN toolkit")\n'
    )
    if mode == "npu":
        return head + (
            "if(EXISTS ${ASCEND_CANN_PACKAGE_PATH}/compiler/tikcpp/ascendc_kernel_cmake)\n"
            "  set(ASCENDC_CMAKE_DIR ${ASCEND_CANN_PACKAGE_PATH}/compiler/tikcpp/ascendc_kernel_cmake)\n"
            "else()\n"
            "  set(ASCENDC_CMAKE_DIR ${ASCEND_CANN_PACKAGE_PATH}/tools/tikcpp/ascendc_kernel_cmake)\n"
            "endif()\n"
            "include(${ASCENDC_CMAKE_DIR}/ascendc.cmake)\n"
            f"ascendc_library(kope_kernels SHARED {source})\n"
            + (f"ascendc_compile_definitions(kope_kernels PRIVATE {defs})\n" if defs else "")
            + (f"ascendc_compile_options(kope_kernels PRIVATE {options})\n" if options else "")
        )
    return head + (
        "set(CMAKE_PREFIX_PATH ${ASCEND_CANN_PACKAGE_PATH}/tools/tikicpulib/lib/cmake)\n"
        "find_package(tikicpulib REQUIRED)\n"
        f"add_library(kope_kernels SHARED {source} kope_cpu_shim.cpp)\n"
        "target_link_libraries(kope_kernels PRIVATE tikicpulib::${SOC_VERSION})\n"
        "target_compile_options(kope_kernels PRIVATE -g -O0 -std=c++17"
        + (f" {options}" if options else "")
        + ")\n"
        + (
            f"target_compile_definitions(kope_kernels PRIVATE {' '.join(f'{k}={v}' for k, v in defines.items())})\n"
            if defines
            else ""
        )
    )


def build_commands(
    src_dir: Path, out_dir: Path, set_env: Path | None = None, jobs: int = 4
) -> list[list[str]]:
    """The commands a build runs, in order; sourced through CANN's set_env.sh when it is not yet."""
    cmds = [
        ["cmake", "-S", str(src_dir), "-B", str(out_dir), "-DCMAKE_BUILD_TYPE=Release"],
        ["cmake", "--build", str(out_dir), "-j", str(jobs)],
    ]
    if set_env is None:
        return cmds
    return [["bash", "-c", f'source "{set_env}" >/dev/null && exec "$@"', "kope-ascendc", *c] for c in cmds]


def cpu_shim(name: str, args: tuple[Arg, ...], types: Mapping[str, str]) -> str:
    """C++ entry `kope_cpu_<name>(blockDim, buf, nbytes, ..., scalars)` running the kernel with ICPU_RUN_KF."""
    params, kparams, body, after, call = ["uint32_t block_dim"], [], [], [], []
    for a in args:
        if a.role == SCALAR:
            params.append(f"{types[a.name]} {a.name}")
            kparams.append(f"{types[a.name]} {a.name}")
            call.append(a.name)
            continue
        params += [f"void *{a.name}", f"size_t {a.name}_bytes"]
        kparams.append(f"GM_ADDR {a.name}")
        body.append(
            f"  uint8_t *g_{a.name} = (uint8_t *)AscendC::GmAlloc({a.name}_bytes);\n"
            f"  std::memcpy(g_{a.name}, {a.name}, {a.name}_bytes);"
        )
        if a.role in (OUT, INOUT):
            after.append(f"  std::memcpy({a.name}, g_{a.name}, {a.name}_bytes);")
        after.append(f"  AscendC::GmFree((void *)g_{a.name});")
        call.append(f"g_{a.name}")
    return (
        '#include <cstring>\n#include "tikicpulib.h"\n'
        f'extern "C" __global__ __aicore__ void {name}({", ".join(kparams)});\n'
        f'extern "C" int kope_cpu_{name}({", ".join(params)}) {{\n' + "\n".join(body) + "\n"
        "  AscendC::SetKernelMode(KernelMode::AIV_MODE);\n"
        f"  ICPU_RUN_KF({name}, block_dim, {', '.join(call)});\n" + "\n".join(after) + "\n  return 0;\n}\n"
    )


class AscendCToolchain(ToolchainBase):
    """Ascend C with CANN: NPU launches and timing, or CPU-debug correctness where there is no NPU."""

    name = "ascendc"
    extensions: tuple[str, ...] = (".cpp", ".asc")
    device_env_var = "ASCEND_RT_VISIBLE_DEVICES"
    passes_env = devices.CANN_ENV

    def _cann(self) -> tuple[Path | None, str, list[str]]:
        home, how = cann_home()
        tools = [t for t in ("bisheng", "ccec") if compiler(home, t)]
        return home, how, tools

    def mode(self) -> str:
        """One of "npu", "cpu-debug" or "missing"."""
        home, _, tools = self._cann()
        if home is None or not tools or shutil.which("cmake") is None:
            return "missing"
        return "npu" if devices.npu_devices()["ok"] else "cpu-debug"

    def availability(self) -> Availability:
        home, how, tools = self._cann()
        if home is None or not tools:
            missing = [] if home else [how]
            if not tools:
                missing.append("no bisheng or ccec compiler on PATH or in the toolkit")
            return Availability(
                False,
                "CANN not found: "
                + "; ".join(missing)
                + "; install the CANN toolkit and `source <ascend-toolkit>/set_env.sh`",
            )
        if shutil.which("cmake") is None:
            return Availability(False, "cmake not found: the ascendc build drives CANN's ascendc.cmake")
        found = devices.npu_devices()
        if found["ok"]:
            return Availability(
                True, f"npu: {found['count']} NPU(s) ({', '.join(found['names'])}), CANN at {how}"
            )
        return Availability(
            True, f"cpu-debug (tikicpulib; correctness only, no timing), CANN at {how}: {found['why']}"
        )

    def count_devices(self) -> int:
        return int(devices.npu_devices().get("count", 0)) if self.mode() == "npu" else 0

    def fingerprint(self) -> dict[str, Any]:
        home, _, tools = self._cann()
        found: dict[str, Any] = devices.npu_devices() if home else {"ok": False}
        return {
            **cpu_fingerprint(),
            "toolchain": self.name,
            "mode": self.mode(),
            "cann": str(home.resolve()) if home else None,
            "soc": os.environ.get("SOC_VERSION", DEFAULT_SOC),
            "device": found["names"][0] if found.get("ok") else "cpu (tikicpulib)",
            "compilers": tools,
        }

    def environment(self) -> Mapping[str, str]:
        return {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}

    def screen(self, candidate: Candidate) -> list[str]:
        return screen_c_source(candidate.source)

    def build(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Kernel:
        mode = self.mode()
        if mode == "missing":
            raise ToolchainMissing(f"toolchain 'ascendc': {self.availability().reason}")
        home, how, _ = self._cann()
        assert home is not None
        where = candidate.filename
        args = kernel_args(spec, where)
        types = {n: scalar_types(d, where) for n, d in zip(args, spec.kernels)}
        params = {**spec.space.defaults, **candidate.params}
        if "BLOCK_DIM" not in params:
            raise BuildError(where, "declare the launch's blockDim: `// kope: param BLOCK_DIM = 8 | 16 | 40`")
        block_dim = int(params["BLOCK_DIM"])
        defines = {k: v for k, v in params.items() if k != FLAGS}
        soc = os.environ.get("SOC_VERSION", DEFAULT_SOC)
        src = Path(build_dir) / f"{Path(where).stem}-{candidate.hash}"
        out = src / "build"
        src.mkdir(parents=True, exist_ok=True)
        (src / Path(where).name).write_text(candidate.source)
        kind = "npu" if mode == "npu" else "cpu"
        if kind == "cpu":
            (src / "kope_cpu_shim.cpp").write_text("".join(cpu_shim(n, args[n], types[n]) for n in args))
        (src / "CMakeLists.txt").write_text(
            cmakelists(Path(where).name, kind, soc, home, defines, str(params.get(FLAGS, "")))
        )
        set_env = None if os.environ.get("ASCEND_HOME_PATH") else home.parent / "set_env.sh"
        log = []
        for cmd in build_commands(src, out, set_env):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            log.append(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                raise BuildError(where, "\n".join(log)[-8000:])
        libs = sorted(out.rglob("libkope_kernels.so"))
        if not libs:
            raise BuildError(where, "the build made no libkope_kernels.so:\n" + "\n".join(log)[-4000:])
        funcs = {
            n: KernelFunction(n, _launcher(libs[0], n, args[n], types[n], block_dim, kind), args[n])
            for n in args
        }
        return Kernel(
            candidate, funcs, build_log="\n".join(log), extra={"device": "npu" if kind == "npu" else "cpu"}
        )

    def bake(self, text: str, params: Mapping[str, Scalar]) -> str:
        """The header's defaults and the source's own defines both the winner's (`cdefines`)."""
        return write_defines(bake_defaults(text, params), params)

    def timer(self) -> Timer:
        if self.mode() != "npu":
            return Timer(
                can_time=False,
                why_not="Ascend C without an NPU runs in CPU-debug mode; its time means nothing",
            )
        import torch
        import torch_npu  # noqa: F401

        return devices.event_timer(getattr(torch, "npu"), "npu")  # noqa: B009 - torch_npu adds it, torch's types do not know


def _launcher(
    lib_path: Path, name: str, args: tuple[Arg, ...], types: Mapping[str, str], block_dim: int, kind: str
) -> Callable[..., None]:
    """A Python callable for one kernel: NPU tensors through aclrtlaunch_<name>, or numpy through the shim."""
    import cffi

    ffi = cffi.FFI()
    if kind == "npu":
        cargs = ", ".join("void *" if a.role != SCALAR else types[a.name] for a in args)
        ffi.cdef(f"uint32_t aclrtlaunch_{name}(uint32_t, void *, {cargs});")
    else:
        cargs = ", ".join("void *, size_t" if a.role != SCALAR else types[a.name] for a in args)
        ffi.cdef(f"int kope_cpu_{name}(uint32_t, {cargs});")
    lib = ffi.dlopen(str(lib_path))

    def call(*values: Any) -> None:
        if len(values) != len(args):
            raise TypeError(f"{name}() takes {len(args)} arguments ({', '.join(a.name for a in args)})")
        if kind == "npu":
            import torch

            npu = getattr(torch, "npu")  # noqa: B009 - torch_npu adds it, torch's types do not know
            stream = ffi.cast("void *", npu.current_stream().npu_stream)
            flat = [ffi.cast("void *", v.data_ptr()) if a.role != SCALAR else v for a, v in zip(args, values)]
            ret = getattr(lib, f"aclrtlaunch_{name}")(block_dim, stream, *flat)
        else:
            flat = []
            for a, v in zip(args, values):
                if a.role == SCALAR:
                    flat.append(v)
                else:
                    if a.role == IN:
                        v = v.copy()  # the shim copies back only outputs; keep inputs untouched regardless
                    flat += [ffi.from_buffer(v), v.nbytes]
            ret = getattr(lib, f"kope_cpu_{name}")(block_dim, *flat)
        if ret != 0:
            raise RuntimeError(f"{name}: launch failed with ACL error {ret}")

    call.__name__ = name
    return call
