"""The Ascend lowering check: every launch of a `triton-ascend` kernel on a machine without an NPU is
compiled for the Ascend target as far as triton-ascend goes without CANN, before its result counts.

Where launches are seen and where they are checked:

* **In a user's plain run** (kernels loaded in-process) `Checking` watches the kernel's module
  (`launches`) and lowers each new launch before the interpreter runs it; a launch that does not
  lower raises `LoweringFailed` from the launcher's call.
* **In a judging run** the kernel lives in a kernel server, whose seccomp filter kills any new
  process, and the compile needs two (`ascend_stages`). So the server only *reports* (`Reporting`):
  each new launch goes back to the test host with the call's answer (`Served.launched`), and the
  host lowers it (`Lowering.check`) before the call returns to the test, which then fails with the
  same one line. The host never loads the kernel: it writes the candidate's text into a fresh folder
  and runs the two child programs there, each in the build jail (`tools.run`).

A check is keyed by the module's text, the kernel's name and everything its compile depends on
(`Launch.key`); every lowering runs in a fresh temporary folder with its own Triton cache, deleted
after, and verdicts live in the object that checked them, so nothing passes because something else
passed before (in this run or an earlier one). A failing launch fails again each time it is made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LoweringFailed
from . import devices, launches, tools
from .ascend_stages import first_error
from .launches import Launch

REPORT_ENV = "KOPE_ASCEND_REPORT"  # "1" in a kernel server: report launches, do not lower them here
TIMEOUT_S = 300.0


@dataclass
class Lowering:
    """The lowering checks of one module's text (`filename` is the name it is written under)."""

    text: str
    filename: str
    target: str
    verdicts: dict[tuple[Any, ...], str | LoweringFailed] = field(default_factory=dict)

    def check(self, launch: Launch) -> str:
        """The stage `launch` reached ("linalg", or "npubin" where CANN is); LoweringFailed if none."""
        __tracebackhide__ = True  # a failing test shows its own line and this one, not the check's frames
        key = launch.key()
        if key not in self.verdicts:
            self.verdicts[key] = self._lower(launch)
        verdict = self.verdicts[key]
        if isinstance(verdict, LoweringFailed):
            raise verdict
        return verdict

    def _lower(self, launch: Launch) -> str | LoweringFailed:
        with tempfile.TemporaryDirectory(prefix="kope-lower-") as tmp:
            folder = Path(tmp)
            (folder / self.filename).write_text(self.text)
            request = {
                "file": self.filename,
                "target": self.target,
                **{k: v for k, v in launch.to_json().items() if k != "module"},
            }
            (folder / "request.json").write_text(json.dumps(request))
            got: dict[str, Any] = {}
            for stage in ("frontend", "linalg"):
                got = _run(stage, folder)
                if "fail" in got:
                    return self._failure(launch.kernel, str(got["fail"]), str(got.get("error", "")))
            return str(got.get("stage", "linalg"))

    def _failure(self, kernel: str, stage: str, error: str) -> LoweringFailed:
        version = devices.installed("triton-ascend") or "?"
        where = {"frontend": "Python -> TTIR", "ttir": "TTIR"}.get(stage, stage)
        return LoweringFailed(
            self.filename,
            f"kernel {kernel} does not lower for Ascend ({self.target}, triton-ascend {version}) "
            f"at {where}: {error}",
        )


def _run(stage: str, folder: Path) -> dict[str, Any]:
    """One child program of `ascend_stages` in `folder`: its JSON answer, or why it gave none."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "TRITON_CACHE_DIR": str(folder / "cache"),
        "HOME": str(folder),
    }
    env.pop(REPORT_ENV, None)
    cmd = [sys.executable, "-m", "pytest_kope.toolchains.ascend_stages", stage, str(folder)]
    try:
        done = tools.run(cmd, folder, TIMEOUT_S, env)
    except subprocess.TimeoutExpired:
        return {"fail": stage, "error": f"took longer than {TIMEOUT_S:.0f} s"}
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and done.returncode == 0:
        return answer
    why = (
        f"exited with status {done.returncode}"
        if done.returncode >= 0
        else f"killed by signal {-done.returncode}"
    )
    if done.returncode == -31:  # SIGSYS: the kernel's module did what the filter forbids
        why += " (the kernel's module started a process or opened a socket)"
    return {"fail": stage, "error": f"the {stage} step {why}: {first_error(done.stderr)}"}


class Checking:
    """In-process launches of one loaded module, lowered before they run (a user's plain run)."""

    def __init__(self, module: Any, target: str):
        path = Path(module.__file__)
        self.target = target
        self.by_file = {str(path): Lowering(path.read_text(), path.name, target)}
        launches.watch(module.__name__, self.observe)

    def observe(self, launch: Launch) -> None:
        __tracebackhide__ = True
        if launch.file not in self.by_file:  # a kernel of another module, launched by this one's launcher
            path = Path(launch.file)
            self.by_file[launch.file] = Lowering(path.read_text(), path.name, self.target)
        self.by_file[launch.file].check(launch)

    def watched(self, launcher: Callable[..., Any]) -> Callable[..., Any]:
        return _watched(launcher, self.observe)


class Reporting:
    """A kernel server's launches, reported to its host with the answer of the call that made them
    (each distinct launch once a call: the host remembers its verdicts, and fails every call that
    makes a failing launch again)."""

    def __init__(self, module: Any):
        self.pending: dict[tuple[Any, ...], dict[str, Any]] = {}
        launches.watch(module.__name__, self.observe)

    def observe(self, launch: Launch) -> None:
        self.pending.setdefault(launch.key(), launch.to_json())

    def take(self) -> list[dict[str, Any]]:
        """The launches since the last call's answer."""
        taken, self.pending = list(self.pending.values()), {}
        return taken

    def watched(self, launcher: Callable[..., Any]) -> Callable[..., Any]:
        return _watched(launcher, self.observe)


def _watched(launcher: Callable[..., Any], observe: Callable[[Launch], None]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        with launches.watching(observe):
            return launcher(*args, **kwargs)

    return call


@dataclass
class HostCheck:
    """The test host's side: lowers what its kernel server reports, raising from the call that launched."""

    lowering: Lowering

    def __call__(self, reports: list[Any]) -> None:
        __tracebackhide__ = True
        for report in reports:
            try:
                launch = Launch.from_json(report)
            except ValueError as e:
                raise LoweringFailed(
                    self.lowering.filename, f"the kernel server's launch report: {e}"
                ) from None
            self.lowering.check(launch)
