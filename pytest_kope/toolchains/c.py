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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..candidate import Candidate
from ..errors import BuildError, SpecError
from ..hardware import cpu_fingerprint
from ..spec import FLAGS, KernelSpec
from .base import IN, INOUT, OUT, SCALAR, Arg, Availability, Kernel, KernelFunction, Timer

BASE_FLAGS = ["-shared", "-fPIC", "-fopenmp"]
_C_STD = {".c": ["-std=gnu11"], ".cc": ["-std=gnu++17"], ".cpp": ["-std=gnu++17"], ".cxx": ["-std=gnu++17"]}
_NUMPY_OF = {
    "float": "float32", "double": "float64", "int": "int32", "int32_t": "int32", "int64_t": "int64",
    "long": "int64", "uint8_t": "uint8", "int8_t": "int8", "short": "int16", "uint16_t": "uint16",
    "unsigned": "uint32", "uint32_t": "uint32", "size_t": "uint64",
}  # fmt: skip
# Calls a kernel has no business making: process, file, network, environment, dynamic loading.
# A source that names one of them is rejected before it is built (README: "Threat model").
FORBIDDEN_CALLS = (
    "system", "popen", "fork", "vfork", "clone", "execl", "execle", "execlp", "execv", "execve", "execvp",
    "posix_spawn", "socket", "connect", "bind", "fopen", "freopen", "open", "openat", "creat", "unlink",
    "unlinkat", "remove", "rename", "rmdir", "mkdir", "getenv", "secure_getenv", "setenv", "putenv",
    "dlopen", "dlsym", "syscall", "ptrace", "kill", "mmap", "mprotect", "chdir", "pthread_create",
    "environ", "__environ",
)  # fmt: skip
# `)`, `,` and `}` catch the name used as a value: `(fork)()`, `{fork, ...}`, `f = (fork);`.
_FORBIDDEN_RE = re.compile(r"\b(" + "|".join(FORBIDDEN_CALLS) + r")\b\s*(\(|;|\[|\)|,|\})")
# The same rule checked on the built library, which macros, token pasting and function pointers
# cannot hide from: symbols it imports, and system-call instructions in its code.
FORBIDDEN_IMPORTS = frozenset(FORBIDDEN_CALLS) | {
    "_Fork", "__clone", "clone3", "thrd_create", "posix_spawnp", "execvpe", "fexecve", "wait", "waitpid",
    "open64", "openat64", "__open_2", "__open64_2", "__openat_2", "__openat64_2", "creat64", "fopen64",
    "freopen64", "fdopen", "tmpfile", "tmpfile64", "mkstemp", "mkostemp", "opendir", "truncate",
    "ftruncate", "link", "linkat", "symlink", "symlinkat", "renameat", "renameat2", "chmod", "chown",
    "write", "writev", "pwrite", "pwrite64", "read", "readv", "pread", "pread64", "dup", "dup2", "dup3",
    "pipe", "ioctl", "fcntl", "exit", "_exit", "_Exit", "quick_exit", "sigaction", "signal", "raise",
    "alarm", "setitimer", "setrlimit", "prlimit", "prctl", "sendto", "sendmsg", "recv", "recvfrom",
    "getaddrinfo", "gethostbyname", "accept", "listen", "shm_open", "memfd_create", "process_vm_readv",
    "process_vm_writev", "dlmopen", "dlvsym", "dladdr", "dl_iterate_phdr", "_r_debug", "mmap64",
}  # fmt: skip
# the Python C API (a kernel that runs Python could patch the oracle) and the dynamic loader's internals
_FORBIDDEN_IMPORT_RE = re.compile(r"^(_?Py|_dl_)")
_SYSCALL_INSN = re.compile(r"\s(syscall|sysenter|int\s+\$0x80|svc\s+#?0x0|svc\s+#?0)\b")
BINARY_SCREEN_ENV = "KOPE_C_SCREEN_BINARY"  # "0" switches the built-library check off (tests of the jail)
# Flags a candidate may choose: optimization, target, code-generation and warning switches. Nothing that
# loads code into the compiler (-fplugin), reads other files (-include, -I, @file, -specs) or links.
_ALLOWED_FLAG = re.compile(
    r"^-(O[0-3sz]?|Ofast|march=[\w.-]+|mtune=[\w.-]+|m[\w-]+(=[\w.,-]+)?|f[\w-]+(=[\w.,-]+)?"
    r"|W[\w-]*(=[\w-]+)?|g\d?|std=[\w+]+|D\w+(=[\w.-]*)?|U\w+|pipe|funroll-loops)$"
)
_DENIED_FLAG = re.compile(
    r"^-f(plugin|profile|auto-profile|debug-prefix-map|file-prefix-map|record|dump|stack-usage)"
)
_DEFINE_VALUE = re.compile(r"^-?[\w.]+$")
_ASM_RE = re.compile(r"\b(__asm__|asm)\b\s*(volatile\s*)?\(\s*\"[^\"]*\bsyscall\b")


@functools.lru_cache(maxsize=4)
def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.splitlines()[0] if out else ""


def parse_prototype(proto: str) -> tuple[str, tuple[Arg, ...], list[str]]:
    """('softmax', args with roles, numpy dtypes of pointer args) from a C prototype."""
    m = re.match(r"^\s*[\w\s\*]+?\b(\w+)\s*\((.*)\)\s*$", proto)
    if not m:
        raise SpecError(
            f"cannot read kernel prototype {proto!r}; write `kope: kernel void f(const float *x, ...)`"
        )
    name, params = m.group(1), m.group(2).strip()
    args, dtypes = [], []
    if params and params != "void":
        for i, p in enumerate(params.split(",")):
            p = " ".join(p.split())
            pm = re.match(r"^(const\s+)?([\w\s]+?)\s*(\*?)\s*(?:restrict\s+|__restrict__\s+)?(\w+)?$", p)
            if not pm:
                raise SpecError(f"cannot read parameter {p!r} of kernel {name}")
            const, ctype, star, pname = (
                pm.group(1),
                pm.group(2).strip(),
                pm.group(3),
                pm.group(4) or f"arg{i}",
            )
            ctype = ctype.replace("const", "").strip()
            if star:
                dtypes.append(_NUMPY_OF.get(ctype.split()[-1], ""))
            args.append(Arg(pname, (IN if const else OUT) if star else SCALAR))
    return name, tuple(args), dtypes


class CToolchain:
    name = "c"
    extensions = (".c", ".cc", ".cpp", ".cxx")
    timed_on_host = True  # its timings are bound by this machine's measured memory and FMA ceilings

    def __init__(self, cc: str | None = None, cxx: str | None = None):
        self.cc = cc or os.environ.get("CC", "gcc")
        self.cxx = cxx or os.environ.get("CXX", "g++")

    def availability(self) -> Availability:
        path = shutil.which(self.cc)
        if not path:
            return Availability(False, f"no C compiler {self.cc!r} on PATH (install gcc or set CC)")
        return Availability(True, compiler_version(self.cc) or path)

    def fingerprint(self) -> dict[str, Any]:
        return {**cpu_fingerprint(), "toolchain": "c", "compiler": compiler_version(self.cc)}

    def screen(self, candidate: Candidate) -> list[str]:
        text = _strip_comments(candidate.source)
        found = sorted({m.group(1) for m in _FORBIDDEN_RE.finditer(text)})
        reasons = [
            f"calls {name}() (process/file/network/environment APIs are not allowed)" for name in found
        ]
        if _ASM_RE.search(text):
            reasons.append("issues a raw syscall from inline assembly")
        flags = shlex.split(str(candidate.params.get(FLAGS, "")))
        reasons += [
            f"compiler flag {f!r} is not allowed (optimization, target and warning flags only)"
            for f in flags
            if not _ALLOWED_FLAG.match(f) or _DENIED_FLAG.match(f)
        ]
        bad_defines = [
            f"{k}={v}" for k, v in candidate.params.items() if k != FLAGS and not _DEFINE_VALUE.match(str(v))
        ]
        reasons += [f"parameter value {d!r} is not a plain number or identifier" for d in bad_defines]
        return reasons

    def build(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Kernel:
        lib_path, log = self._compile(candidate, Path(build_dir))
        return self._load(candidate, spec, lib_path, log)

    def command(self, candidate: Candidate, src: Path, out: Path) -> list[str]:
        """The compiler command line for a candidate (public so reports and tests can show it)."""
        suffix = Path(candidate.filename).suffix
        cc = self.cc if suffix == ".c" else self.cxx
        flags = shlex.split(str(candidate.params.get(FLAGS, "-O2")))
        defines = [f"-D{k}={v}" for k, v in sorted(candidate.params.items()) if k != FLAGS]
        return [cc, *BASE_FLAGS, *_C_STD.get(suffix, []), *flags, *defines, str(src), "-o", str(out), "-lm"]

    def timer(self) -> Timer:
        return Timer()

    def environment(self) -> Mapping[str, str]:
        # OpenMP workers that spin make timings swing several-fold on a loaded small machine.
        return {"OMP_WAIT_POLICY": "passive"}

    def _compile(self, candidate: Candidate, build_dir: Path) -> tuple[Path, str]:
        probe = self.command(candidate, Path("src"), Path("out"))
        key = hashlib.sha256(
            "\0".join([candidate.source, *probe, compiler_version(probe[0])]).encode()
        ).hexdigest()[:20]
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
        cmd = self.command(candidate, src, tmp / "kernel.so")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise BuildError(candidate.filename, "compiler timed out after 300 s") from None
        log = (proc.stdout + proc.stderr).replace(str(tmp) + "/", "")
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(candidate.filename, f"$ {shlex.join(cmd).replace(str(tmp) + '/', '')}\n{log}")
        (tmp / "build.log").write_text(log)
        if os.environ.get(BINARY_SCREEN_ENV, "1") != "0":
            reasons = screen_library(tmp / "kernel.so")
            if reasons:
                shutil.rmtree(tmp, ignore_errors=True)
                raise BuildError(candidate.filename, "screening: " + "; ".join(reasons))
        try:
            tmp.rename(target)
        except OSError:  # another process built the same key first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
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
        from ..judge import fpstate

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
            functions[name] = KernelFunction(name, _numpy_caller(ffi, fn, name, args, dtypes), args)
        return Kernel(candidate, functions, build_log=log, extra={"library": str(lib_path), "ffi": ffi})


def screen_library(lib: Path) -> list[str]:
    """Why a built kernel library must not be loaded: forbidden imports or raw system calls; [] if fine.

    Fails closed: a library that cannot be inspected (no binutils) is refused.
    """
    try:
        nm = subprocess.run(
            ["nm", "-D", "--undefined-only", "--format=posix", str(lib)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        dis = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.SubprocessError) as e:
        return [f"cannot inspect the built library ({e}); install binutils (nm, objdump)"]
    if nm.returncode != 0 or dis.returncode != 0:
        return [f"cannot inspect the built library: {(nm.stderr or dis.stderr).strip()[:200]}"]
    imported = {line.split()[0].split("@")[0] for line in nm.stdout.splitlines() if line.strip()}
    bad = sorted(n for n in imported if n in FORBIDDEN_IMPORTS or _FORBIDDEN_IMPORT_RE.match(n))
    reasons = [f"the built library imports {', '.join(bad)} (not allowed in a kernel)"] if bad else []
    insns = sorted({m.group(1) for m in _SYSCALL_INSN.finditer(dis.stdout)})
    if insns:
        reasons.append(f"the built library issues raw system calls ({', '.join(insns)})")
    return reasons


def _numpy_caller(ffi: Any, fn: Any, name: str, args: tuple[Arg, ...], dtypes: list[str]):
    """Wrap a cffi function so it takes numpy arrays for pointers, checking dtype and contiguity."""
    import numpy as np

    pointer_dtypes = iter(dtypes)
    plan = [(a, next(pointer_dtypes) if a.role != SCALAR else None) for a in args]

    def call(*values):
        if len(values) != len(plan):
            raise TypeError(f"{name}() takes {len(plan)} arguments ({len(values)} given)")
        converted = []
        for (arg, dtype), value in zip(plan, values):
            if dtype is None:
                converted.append(value.item() if hasattr(value, "item") else value)
                continue
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"{name}(): argument {arg.name} must be a numpy array, got {type(value).__name__}"
                )
            if dtype and value.dtype != np.dtype(dtype):
                raise TypeError(f"{name}(): argument {arg.name} must be {dtype}, got {value.dtype}")
            if not value.flags.c_contiguous:
                raise TypeError(
                    f"{name}(): argument {arg.name} must be C-contiguous (use np.ascontiguousarray)"
                )
            converted.append(ffi.cast("void *", value.ctypes.data))
        return fn(*converted)

    call.__name__ = name
    return call


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)
