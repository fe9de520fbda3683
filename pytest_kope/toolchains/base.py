"""What a toolchain is: it builds a candidate into callable kernels, names its hardware, and times calls.

A toolchain is a plain object made by the `pytest_kope_make_toolchain` hook, so a child process
rebuilds it from its name alone. Built-ins: `c` (always), `triton`, `triton-ascend`, `ascendc`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..candidate import Candidate
from ..spec import KernelSpec, Scalar, bake_defaults

IN, OUT, INOUT, SCALAR = "in", "out", "inout", "scalar"


@dataclass(frozen=True)
class Arg:
    """One parameter of a kernel function; `role` tells the oracle guards what to check."""

    name: str
    role: str  # IN (read only), OUT (must be fully written), INOUT (declared in place), SCALAR


@dataclass
class KernelFunction:
    """One callable kernel: the raw entry point plus its argument roles."""

    name: str
    raw: Callable[..., Any]
    args: tuple[Arg, ...]
    # Safe to call from several threads at once: only then does the differential check replay calls
    # concurrently to expose state shared between threads (one lucky concurrent run proves nothing).
    reentrant: bool = True


@dataclass
class Kernel:
    """A built candidate: its functions by name, and the candidate it came from."""

    candidate: Candidate
    functions: Mapping[str, KernelFunction]
    build_log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Served:
    """How a kernel server loads one built candidate (`judge/kernel`): the load request it is sent,
    each function's arguments (from the committed interface the host holds, never from the server),
    what its jail may read and write besides the interpreter, the modules it imports, the host-side
    check of each function's arguments, the build's log, for a sanitized build the variables that
    load its runtime and the folder where that runtime writes what it found, and what the host does
    with the launches a call reports (`launched`: the Ascend lowering check; it raises to fail the
    call)."""

    load: dict[str, Any]
    args: Mapping[str, tuple[Arg, ...]]
    readable: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    modules: tuple[str, ...] = ()
    checks: Mapping[str, Callable[[tuple[Any, ...]], None]] = field(default_factory=dict)
    build_log: str = ""
    environment: Mapping[str, str] = field(
        default_factory=dict
    )  # set in the server's (a sanitizer's runtime)
    reports: Path | None = None  # a folder in `writable` where the server's runtime reports a fault
    launched: Callable[[list[Any]], None] | None = None


@dataclass(frozen=True)
class Availability:
    """Whether a toolchain can build and run here, and why."""

    ok: bool
    reason: str  # one line: what was found, or what is missing and how to get it


@dataclass(frozen=True)
class Timer:
    """A clock for one toolchain. `sync` waits for queued device work (no-op on a CPU)."""

    clock: Callable[[], float] = time.perf_counter
    sync: Callable[[], None] = lambda: None
    can_time: bool = True
    why_not: str = ""


@runtime_checkable
class Toolchain(Protocol):
    """What callers use of a toolchain. Subclass `ToolchainBase` for the defaults of all but the
    first four (availability, fingerprint, screen, build)."""

    name: str
    extensions: tuple[str, ...]  # source suffixes it builds by default, e.g. (".c", ".cpp")
    device_env_var: str | None  # the variable that pins a process to devices (CUDA_VISIBLE_DEVICES)
    jit_cache_env: str | None  # where its JIT keeps compiled kernels (TRITON_CACHE_DIR); None: no JIT
    passes_env: tuple[str, ...]  # variables its judging children need from the controller's environment
    timed_on_host: bool  # its timings are bound by this machine's measured memory and FMA ceilings

    @property
    def sanitize_env(self) -> str | None:
        """The variable that, set to "1" in a judging child, has it build and serve its kernels with
        AddressSanitizer and UndefinedBehaviorSanitizer; None where it cannot (no runtime, no C)."""

    def availability(self) -> Availability:
        """Whether it can build and run here, and why; must have no side effects."""

    def fingerprint(self) -> dict[str, Any]:
        """The hardware and tool versions its measurements belong to (see hardware.py for keys)."""

    def screen(self, candidate: Candidate) -> list[str]:
        """Reasons to reject a candidate before it is built (forbidden APIs); empty when clean."""

    def build(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Kernel:
        """Build (or check) the candidate and load it; raise BuildError quoting the tool's message."""

    def timer(self) -> Timer:
        """The clock that `kope_bench` uses for this toolchain's kernels."""

    def environment(self) -> Mapping[str, str]:
        """Settings of its own for judging children (e.g. OMP_WAIT_POLICY=passive)."""

    def passed_env(self) -> dict[str, str]:
        """The controller's values of `passes_env` and `device_env_var`, for judging children."""

    def count_devices(self) -> int:
        """Accelerators it can judge on here (0 on a CPU): one timing worker each."""

    def bake(self, text: str, params: Mapping[str, Scalar]) -> str:
        """The source with a winner's tuning values written in as its defaults (the committed file)."""

    def served(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Served:
        """Build (or find built) what a kernel server loads, loading nothing here."""


@runtime_checkable
class BuildsAhead(Protocol):
    """A toolchain that compiles apart from loading (c.py): a build step compiles a candidate into
    the folder `build_key` names, so a judging child finds it built and loads it."""

    def compile(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> tuple[Path, str]:
        """Build and screen the library without loading it: (library, build log)."""

    def build_key(self, candidate: Candidate, spec: KernelSpec | None) -> str:
        """The folder a build of `candidate` makes under its build dir: a hash of all it reads."""

    def check_built(self, folder: Path) -> list[str]:
        """Reasons to refuse a build step's output (`folder`) for the run's cache; empty: sound."""


def judging_env(toolchain: Toolchain) -> dict[str, str]:
    """What every judging child of `toolchain` gets from the controller: the variables it passes
    through, then its own settings. One place, so a bench's children judge as a run's do."""
    return {**toolchain.passed_env(), **toolchain.environment()}


class ToolchainBase:
    """Defaults a toolchain shares with most others; a new toolchain subclasses it and sets what differs."""

    name: str = ""
    extensions: tuple[str, ...] = ()
    device_env_var: str | None = None
    jit_cache_env: str | None = None
    passes_env: tuple[str, ...] = ()
    timed_on_host: bool = False
    server_imports: tuple[str, ...] = ()  # modules a kernel server imports before its filter (torch)

    @property
    def sanitize_env(self) -> str | None:
        return None

    def timer(self) -> Timer:
        return Timer()

    def environment(self) -> Mapping[str, str]:
        return {}

    def passed_env(self) -> dict[str, str]:
        """The controller's values of `passes_env` and `device_env_var` that are set."""
        names = (*self.passes_env, *((self.device_env_var,) if self.device_env_var else ()))
        return {k: os.environ[k] for k in names if k in os.environ}

    def count_devices(self) -> int:
        return 0

    def bake(self, text: str, params: Mapping[str, Scalar]) -> str:
        return bake_defaults(text, params)

    def served(self, candidate: Candidate, spec: KernelSpec, build_dir: Path) -> Served:
        """By default the server makes this toolchain itself (its class, no arguments, imported from
        its module's file when no package holds it: a repo's conftest) and builds the candidate there,
        in its jail and under its filter: nothing is built or loaded here. The arguments' roles are
        left to the host, which reads them from the committed interface (`toolchains/interface.py`)."""
        import inspect

        cls = type(self)
        module_file = Path(inspect.getsourcefile(cls) or "")
        return Served(
            {
                "kind": "toolchain",
                "factory": f"{cls.__module__}:{cls.__qualname__}",
                "candidate": candidate.to_json(),
                # the committed interface, as the host read it (the server sees no repo)
                "kernels": list(spec.kernels),
                "inplace": sorted(spec.inplace),
                "build_dir": "/tmp/kope-build",
                "environment": dict(self.environment()),
                "imports": list(self.server_imports),
                "factory_file": str(module_file),
            },
            {},
            readable=(module_file.parent,) if module_file.name else (),
            modules=self.server_imports,
        )
