"""What isolation a run has here, said once at its start, and the refusal to run an agent's code
without a jail unless the user trusts it (`--kope-allow-unjailed`)."""

from __future__ import annotations

import shutil

from ...errors import ConfigError
from ..kernel import cgroups, seccomp
from . import sandbox


def isolation_summary() -> list[str]:
    """One line per layer of isolation available here, for the report."""
    jail, why = sandbox.bubblewrap()
    lines = [
        "kernel servers: each kernel runs in a process of its own, stopped between calls; the tests, "
        "the clock and the verdict run in processes that never load one",
        why,
    ]
    if jail is None:
        lines.append(
            "unjailed: a candidate runs with your user's rights: it can read and write your files and "
            "start what the filter allows (use it only for code you trust: --kope-allow-unjailed)"
        )
    lines.append(
        "seccomp: no socket, no new process, no tracing or signal of another process, no new "
        "executable memory"
        if seccomp.available()
        else "no seccomp filter: libseccomp.so.2 not found (apt-get install libseccomp2)"
    )
    lines.append(
        "cgroups: memory and processes bounded where a kernel cannot see it (no address-space rlimit)"
        if cgroups.writable()
        else "no writable cgroup: a kernel server's memory is bounded by the machine only"
    )
    return lines


def require_jail(agent: str, allow_unjailed: bool) -> None:
    """Refuse to start a run whose agent writes code (an LLM, a replayed folder, a plugin's agent)
    when there is no jail, unless `allow_unjailed`; raises ConfigError with one line.

    The caller allows the built-in tuner: it only rebuilds the committed source with other -D values
    and flags, so it may run unjailed (the run's header says there is no jail).
    """
    jail, why = sandbox.bubblewrap()
    if jail or allow_unjailed:
        return
    why = "bubblewrap is not installed" if shutil.which("bwrap") is None else why
    raise ConfigError(
        f"--kope-agent {agent} writes untrusted code, which runs only in the bubblewrap jail, but here {why}: "
        "install it (apt-get install bubblewrap) or pass --kope-allow-unjailed to run candidates without it"
    )
