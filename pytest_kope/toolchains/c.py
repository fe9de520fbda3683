"""The `c` toolchain: C/C++ kernels built by the system compiler into a shared library, loaded with cffi.

The library is cached by content hash (source, params, flags, compiler version), so a rerun of the
same candidate costs nothing. Array arguments are numpy arrays whose dtype must match the prototype.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..errors import BuildError, ConfigError, SpecError
from ..hardware import cpu_fingerprint
from ..spec import FLAGS, KernelSpec, Scalar, bake_defaults
from . import sanitize, tools
from .base import (
    INOUT,
    OUT,
    Arg,
    Availability,
    Kernel,
    KernelFunction,
    Served,
    Timer,
    ToolchainBase,
)
from .cdefines import write_defines
from .cproto import argument_check, numpy_caller
from .cproto import parse_prototype as parse_prototype  # where plugin toolchains found it
from .flagblock import carried
from .ownbuild import keep_screened, own_build, own_build_key
from .screening import (  # noqa: F401 - FORBIDDEN_CALLS and strip_c_comments are re-exported
    BINARY_SCREEN_ENV,
    FORBIDDEN_CALLS,
    compiler_flag_ok,
    screen_c_source,
    screen_library,
    strip_c_comments,
)

BASE_FLAGS = ["-shared", "-fPIC", "-fopenmp"]
TARGET_ENV = "KOPE_C_TARGET_FLAGS"  # flags after every candidate's own (the ini option kope_c_target_flags)
_C_STD = {".c": ["-std=gnu11"], ".cc": ["-std=gnu++17"], ".cpp": ["-std=gnu++17"], ".cxx": ["-std=gnu++17"]}
_DEFINE_VALUE = re.compile(r"^-?[\w.]+$")


@functools.lru_cache(maxsize=4)
def compiler_version(cc: str) -> str:
    """The first line of `cc --version`, or '' when it cannot be run."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0] if out else ""


class CToolchain(ToolchainBase):
    """C and C++ kernels built with gcc or clang, loaded with cffi, timed on the host."""

    name = "c"
    extensions: tuple[str, ...] = (".c", ".cc", ".cpp", ".cxx")
    passes_env: tuple[str, ...] = ("CC", "CXX", BINARY_SCREEN_ENV, TARGET_ENV)
    timed_on_host = True  # its timings are bound by this machine's measured memory and FMA ceilings

    def __init__(
        self,
        cc: str | None = None,
        cxx: str | None = None,
        allow_symbols: Iterable[str] = (),
        target_flags: str | None = None,
    ):
        self.cc = cc or os.environ.get("CC", "gcc")
        self.cxx = cxx or os.environ.get("CXX", "g++")
        # names or globs a built library may import besides the built-in allow-list (kope_allow_symbols)
        self.allow_symbols = tuple(s.strip() for s in allow_symbols if s.strip())
        # after every candidate's own flags, to tune for the machines the kernels will run on (e.g.
        # -mno-avx512f for an AVX2 fleet); judging children get them through the environment
        self.target_flags = tuple(shlex.split(target_flags or os.environ.get(TARGET_ENV, "")))
        if bad := " ".join(f for f in self.target_flags if not compiler_flag_ok(f)):
            raise ConfigError(
                f"{TARGET_ENV} / kope_c_target_flags: {bad!r} is not a target, optimization or warning "
                "flag; give flags such as -mno-avx512f or -march=haswell"
            )

    def availability(self) -> Availability:
        path = shutil.which(self.cc)
        if not path:
            return Availability(False, f"no C compiler {self.cc!r} on PATH (install gcc or set CC)")
        return Availability(True, compiler_version(self.cc) or path)

    def fingerprint(self) -> dict[str, Any]:
        fp = {**cpu_fingerprint(), "toolchain": "c", "compiler": compiler_version(self.cc)}
        if self.target_flags:  # another kind of hardware for the graph: what was learned differs
            fp["target_flags"] = " ".join(self.target_flags)
        return fp

    def screen(self, candidate: Candidate) -> list[str]:
        reasons = screen_c_source(candidate.source)
        flags = shlex.split(str(candidate.params.get(FLAGS, "")))
        reasons += [
            f"compiler flag {f!r} is not allowed (optimization, target and warning flags only)"
            for f in flags
            if not compiler_flag_ok(f)
        ]
        bad_defines = [
            f"{k}={v}" for k, v in candidate.params.items() if k != FLAGS and not _DEFINE_VALUE.match(str(v))
        ]
        reasons += [f"parameter value {d!r} is not a plain number or identifier" for d in bad_defines]
        return reasons

    def build(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Kernel:
        lib_path, log = self.compile(candidate, spec, build_dir)
        return self._load(candidate, spec, lib_path, log)

    def kernel_args(self, spec: KernelSpec, where: str) -> dict[str, tuple[Arg, ...]]:
        """Each prototype's arguments by function, `inplace` ones in-out (the committed interface)."""
        if not spec.kernels:
            raise SpecError(
                f"{where} declares no kernels; add a line like "
                "`// kope: kernel void f(const float *x, float *y, int n)`"
            )
        found = {}
        for proto in spec.kernels:
            name, args, _ = parse_prototype(proto)
            found[name] = tuple(
                Arg(a.name, INOUT) if a.name in spec.inplace and a.role == OUT else a for a in args
            )
        return found

    def served(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Served:
        """The library, built (or found in the build cache) here, loaded by the server with cffi."""
        lib, log = self.compile(candidate, spec, build_dir)
        args = self.kernel_args(spec, candidate.filename)
        checks = {}
        for proto in spec.kernels:
            name, _, dtypes = parse_prototype(proto)
            checks[name] = argument_check(name, args[name], dtypes)
        load: dict[str, Any] = {
            "kind": "cffi", "library": str(lib), "prototypes": list(spec.kernels), "names": list(args)
        }  # fmt: skip
        if not sanitize.wanted():
            return Served(load, args, readable=(lib.parent,), checks=checks, build_log=log)
        env, reports, runtime = sanitize.served(
            self.cc if Path(candidate.filename).suffix == ".c" else self.cxx
        )
        load["sanitize"] = True
        return Served(
            load,
            args,
            (lib.parent, *runtime),
            (reports,),
            checks=checks,
            build_log=log,
            environment=env,
            reports=reports,
        )

    @property
    def sanitize_env(self) -> str | None:
        """`sanitize.ENV` where the compiler has the sanitizers' runtime (a sanitized server preloads it)."""
        return sanitize.ENV if sanitize.runtime(self.cc) is not None else None

    # The judge's build cache: a build step compiles (never loads) into its own dir, and the
    # controller moves `build_key`'s entry into the run's cache once the step's process is gone.
    def compile(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> tuple[Path, str]:
        """Build and screen the library without loading it: (library, build log)."""
        candidate = carried(candidate, spec)  # a kernel the repo builds itself: its flags in the source
        if spec.build is not None:
            return own_build(candidate, spec, Path(build_dir), self._screen_library)
        return self._compile(candidate, Path(build_dir), spec)

    def build_key(self, candidate: Candidate, spec: KernelSpec | None) -> str:
        """The folder a build of `candidate` makes under its build dir: a hash of everything it reads."""
        candidate = carried(candidate, spec) if spec is not None else candidate
        if spec is not None and spec.build is not None:
            return own_build_key(candidate, spec)
        probe = self.command(candidate, Path("src"), Path("out"), spec)
        screened = os.environ.get(BINARY_SCREEN_ENV, "1") != "0"
        # a library screened under other rules (a wider allow-list, or none) is not reused under these
        rules = ["screened" if screened else "unscreened", *sorted(self.allow_symbols)]
        return hashlib.sha256(
            "\0".join(
                [candidate.source, *probe, compiler_version(probe[0]), *rules, _context_digest(spec)]
            ).encode()
        ).hexdigest()[:20]

    def check_built(self, folder: Path) -> list[str]:
        """Reasons to refuse a build step's output for the cache; empty when it is sound.

        gcc and the library screen run no candidate code, so what the step screened is what it left;
        a repo's own build command may run what it built, so that library is screened again here.
        """
        lib = Path(folder) / "kernel.so"
        if not lib.is_file() or lib.is_symlink():
            return [f"the build made no library {lib.name}"]
        return self._screen_library(lib) if Path(folder).name.startswith("own-") else []

    def _screen_library(self, lib: Path) -> list[str]:
        if os.environ.get(BINARY_SCREEN_ENV, "1") == "0":
            return []
        return screen_library(lib, self.allow_symbols + (sanitize.SYMBOLS if sanitize.wanted() else ()))

    def command(
        self, candidate: Candidate, src: Path, out: Path, spec: KernelSpec | None = None
    ) -> list[str]:
        """The compiler command line for a candidate (public so reports and tests can show it).

        The operator's include directories (its source's own folder first, so `#include "common.h"`
        beside it works) and companion sources come from the marker, never from the candidate.
        """
        suffix = Path(candidate.filename).suffix
        cc = self.cc if suffix == ".c" else self.cxx
        flags = shlex.split(str(candidate.params.get(FLAGS, "-O2")))
        defines = [f"-D{k}={v}" for k, v in sorted(candidate.params.items()) if k != FLAGS]
        includes = [f"-I{d}" for d in spec.include_dirs] if spec else []
        companions = list(spec.companions) if spec else []
        return [
            cc, *BASE_FLAGS, *_C_STD.get(suffix, []), *flags, *self.target_flags,
            *(sanitize.FLAGS if sanitize.wanted() else ()), *defines, *includes,
            str(src), *companions, "-o", str(out), "-lm",
        ]  # fmt: skip

    def bake(self, text: str, params: Mapping[str, Scalar]) -> str:
        """The header's defaults and the source's own defines both the winner's (`cdefines`)."""
        return write_defines(bake_defaults(text, params), params)

    def timer(self) -> Timer:
        return Timer()

    def environment(self) -> Mapping[str, str]:
        # OpenMP workers that spin make timings swing several-fold on a loaded small machine.
        env = {"OMP_WAIT_POLICY": "passive"}
        if self.target_flags:
            env[TARGET_ENV] = " ".join(self.target_flags)
        return env

    def _compile(
        self, candidate: Candidate, build_dir: Path, spec: KernelSpec | None = None
    ) -> tuple[Path, str]:
        key = self.build_key(candidate, spec)
        target = build_dir / key
        lib = target / "kernel.so"
        if lib.exists():
            return lib, (target / "build.log").read_text() if (target / "build.log").exists() else ""
        build_dir.mkdir(parents=True, exist_ok=True)
        tmp = build_dir / f".{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        src = tmp / Path(candidate.filename).name
        src.write_text(candidate.source)
        cmd = self.command(candidate, src, tmp / "kernel.so", spec)
        try:
            readable: list[Path | str] = [*(spec.include_dirs if spec else ())]
            readable += [Path(c).parent for c in (spec.companions if spec else ())]
            proc = tools.run(cmd, tmp, 300, readable=readable)
        except subprocess.TimeoutExpired:
            raise BuildError(candidate.filename, "compiler timed out after 300 s") from None
        log = (proc.stdout + proc.stderr).replace(str(tmp) + "/", "")
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(candidate.filename, f"$ {shlex.join(cmd).replace(str(tmp) + '/', '')}\n{log}")
        (tmp / "build.log").write_text(log)
        keep_screened(tmp, target, self._screen_library, candidate.filename)
        return lib, log

    def _load(self, candidate: Candidate, spec: KernelSpec, lib_path: Path, log: str) -> Kernel:
        import cffi

        if not spec.kernels:
            raise SpecError(
                f"{candidate.filename} declares no kernels; add a line like "
                "`// kope: kernel void f(const float *x, float *y, int n)`"
            )
        ffi = cffi.FFI()
        try:
            ffi.cdef("\n".join(k.rstrip(";") + ";" for k in spec.kernels))
        except cffi.CDefError as e:
            raise SpecError(f"{candidate.filename}: cannot read the kernel prototypes: {e}") from None
        from ..judge.child import fpstate

        before = fpstate.read()
        lib = ffi.dlopen(str(lib_path))
        after = fpstate.read()
        if before is not None and after is not None and (before ^ after) & fpstate.CONTROL_MASK:
            fpstate.write(before)  # e.g. -ffast-math links crtfastmath.o, which sets FTZ/DAZ at load
            raise BuildError(
                candidate.filename,
                f"loading the library changed the floating-point control state (MXCSR {before:#06x} -> "
                f"{after:#06x}, e.g. FTZ/DAZ from -ffast-math's crtfastmath.o); drop -ffast-math/-Ofast",
            )
        functions = {}
        for proto in spec.kernels:
            name, args, dtypes = parse_prototype(proto)
            args = tuple(Arg(a.name, INOUT) if a.name in spec.inplace and a.role == OUT else a for a in args)
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise BuildError(candidate.filename, f"the library does not export kernel {name}()") from None
            functions[name] = KernelFunction(name, numpy_caller(ffi, fn, name, args, dtypes), args)
        return Kernel(candidate, functions, build_log=log, extra={"library": str(lib_path), "ffi": ffi})


HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inc", ".inl", ".cuh")


def _context_digest(spec: KernelSpec | None, limit: int = 4 << 20) -> str:
    """A digest of the headers and companion sources a build reads, so a changed header rebuilds."""
    if spec is None:
        return ""
    files = [Path(c) for c in spec.companions]
    for i, d in enumerate(spec.include_dirs):
        # the source's own folder (first) also holds tests and data: only its headers count
        found = Path(d).glob("*") if i == 0 else Path(d).rglob("*")
        files += sorted(p for p in found if p.is_file() and (i > 0 or p.suffix in HEADER_SUFFIXES))
    h, seen = hashlib.sha256(), 0
    for f in files:
        data = f.read_bytes()[: max(0, limit - seen)]
        seen += len(data)
        h.update(str(f).encode() + b"\0" + data)
    return h.hexdigest()
