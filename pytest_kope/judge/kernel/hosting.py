"""A test host's kernels: each one served by a kernel server of its own, never loaded here.

`serve` is what the `kernel` fixture's back end (`child/building.py`) calls in a judging process (the
launcher sets KOPE_KERNEL_SERVER) and in the plain-pytest check of a winner: the toolchain builds (or
finds built) what the server loads, the server is started in its jail and cgroups, and the host gets a
`Kernel` whose functions forward each call (`remote.Forwarded`). Servers end with the process.
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...candidate import Candidate
from ...errors import BuildError, KernelError
from ...toolchains.base import Kernel, KernelFunction, Toolchain
from . import cgroups
from .process import Confinement, KernelProcess
from .remote import Forwarded

if TYPE_CHECKING:
    from ...spec import KernelSpec

ENV = "KOPE_KERNEL_SERVER"  # set (to "1") in every process whose kernels must be served, not loaded
USER_ENV = "KOPE_SERVER_ENVIRONMENT"  # the user's environment (JSON), as a kernel server gets it
JAIL_ENV = "KOPE_SERVER_JAIL"  # "0": the run has no jail (the controller decides, once, for every server)
CALL_TIMEOUT_ENV = "KOPE_CALL_TIMEOUT"  # seconds a kernel request may take (the judgement's wall time)


def wanted() -> bool:
    """Whether this process serves its kernels from kernel servers."""
    return os.environ.get(ENV, "") not in ("", "0")


def serve(tc: Toolchain, candidate: Candidate, interface: KernelSpec, build_dir: Path) -> Kernel:
    """Start a server for `candidate` (built by `tc` into `build_dir`) and return its forwarding kernel;
    BuildError when the server cannot load it (a missing symbol, FP state changed at load)."""
    from ...toolchains.interface import kernel_args
    from ..child import fpstate
    from ..controller import sandbox

    served = tc.served(candidate, interface, build_dir)
    declared = served.args or kernel_args(tc, interface, candidate.filename)
    helper = fpstate.helper_library()
    jail = sandbox.bubblewrap()[0] if os.environ.get(JAIL_ENV) != "0" else None
    jit = os.environ.get(tc.jit_cache_env) if tc.jit_cache_env else None
    load = {**served.load, "fpstate_lib": str(helper) if helper else None}
    env = {**server_environment(tc.jit_cache_env), **served.environment}
    readable = [*served.readable, *((helper.parent,) if helper else ())]
    writable = [*([Path(jit)] if jit else []), *served.writable]
    if jail:  # the jail shows each folder at a path of its own, naming nothing of the host
        shown = {str(p): f"/kope/r{i}" for i, p in enumerate(readable)}
        shown.update({str(p): f"/kope/w{i}" for i, p in enumerate(writable)})
        load = {k: _moved(v, shown) for k, v in load.items()}
        env.update({k: _moved_within(v, shown) for k, v in served.environment.items()})
        if jit and tc.jit_cache_env:
            env[tc.jit_cache_env] = shown[jit]
        readable_in: list[Path | tuple[Path, str]] = [(p, shown[str(p)]) for p in readable]
        writable_in: list[Path | tuple[Path, str]] = [(p, shown[str(p)]) for p in writable]
    else:  # unjailed, a private temp folder of its own
        env["TMPDIR"] = env["HOME"] = tempfile.mkdtemp(prefix="kope-server-")
        if jit and tc.jit_cache_env:
            env[tc.jit_cache_env] = jit
        readable_in, writable_in = list(readable), list(writable)
    groups = cgroups.make()
    timeout = float(os.environ.get(CALL_TIMEOUT_ENV, "0")) or None
    confinement = Confinement(
        jail, readable_in, writable_in, served.modules, groups, call_timeout_s=timeout, reports=served.reports
    )
    try:
        server, answer = KernelProcess.start(load, confinement, env)
    except KernelError as e:
        cgroups.remove(groups)
        raise BuildError(candidate.filename, f"the kernel server could not load it: {e}") from None
    atexit.register(_end, server, groups)
    functions = {
        name: KernelFunction(
            name,
            Forwarded(server, name, args, served.checks.get(name, _no_check), launched=served.launched),
            args,
            reentrant=bool(answer.get("reentrant", False)),
        )
        for name, args in declared.items()
    }
    notes = "".join(f"\n{n}" for n in answer.get("notes", []))
    return Kernel(candidate, functions, build_log=served.build_log + notes, extra={"server": server})


def user_environment(settings: dict[str, str]) -> str:
    """The environment a kernel server gets, for a host to pass on (`USER_ENV`): the user's own, as
    their plain `pytest` has it, with `settings` (the toolchain's and the judged environment's
    threading variables) over it, nothing named like a secret, and no TMPDIR (the jail's /tmp is
    its own). Not the host's: a variable only the judge sets is a switch a kernel could key on."""
    from ..controller.sandbox import SECRET_NAME

    env = {**os.environ, **settings}
    return json.dumps({k: v for k, v in env.items() if not SECRET_NAME.search(k) and k != "TMPDIR"})


def server_environment(jit_env: str | None) -> dict[str, str]:
    """A kernel server's environment: the user's as its host was given it (`USER_ENV`), else this
    process's less the judge's own variables; without the JIT cache's variable (set per server)."""
    from ..controller.sandbox import SECRET_NAME

    given = os.environ.get(USER_ENV)
    env: dict[str, str] = (
        json.loads(given)
        if given
        else {k: v for k, v in os.environ.items() if not k.startswith("KOPE_") and not SECRET_NAME.search(k)}
    )
    env.pop(jit_env or "", None)
    return env


def _moved(value: Any, shown: dict[str, str]) -> Any:
    """A host path in the load request as the jail shows it."""
    if isinstance(value, str):
        for host, inside in shown.items():
            if value == host or value.startswith(host + "/"):
                return inside + value[len(host) :]
    return value


def _moved_within(value: str, shown: dict[str, str]) -> str:
    """Every host path inside a variable's value (`log_path=/host/dir/file:...`) as the jail shows it."""
    for host, inside in shown.items():
        value = value.replace(host + "/", inside + "/")
    return value


def _no_check(values: tuple[Any, ...]) -> None:
    pass


def _end(server: KernelProcess, groups: list[Path]) -> None:
    server.close()
    cgroups.remove(groups)
