"""Domain errors, named for the condition. Converted once, at the pytest border, into a usage error
or an item failure; each message says what happened, to which file, and what to do."""

from __future__ import annotations


class KopeError(Exception):
    """Base of every error pytest-kope raises on purpose."""


class SpecError(KopeError):
    """A `kope:` header line in a kernel source cannot be understood."""


class BuildError(KopeError):
    """A candidate failed to build; carries the compiler's own message."""

    def __init__(self, source: str, log: str):
        self.source, self.log = source, log
        super().__init__(f"build of {source} failed:\n{log.rstrip()}")


class LoweringFailed(BuildError):
    """A Triton kernel launch that does not compile for the Ascend target (the check every launch of a
    `triton-ascend` kernel passes through without an NPU); the message is one line: kernel, target,
    stage and triton-ascend's first error."""

    def __init__(self, source: str, line: str):
        self.line = line
        super().__init__(source, line)

    def __str__(self) -> str:
        return self.line


class BuildFailed(KopeError):
    """A test's kernel could not be built or loaded (the message names the operator, the file and why);
    every test of that candidate fails with it."""


class LibraryRejected(BuildError):
    """A candidate built, but the built library does something no kernel may (screened after the build)."""


class InterfaceChanged(KopeError):
    """A candidate declares kernels or in-place arguments other than the committed source's."""


class ToolchainMissing(KopeError):
    """The toolchain an operator needs is not installed or has no device here."""


class BaselineBroken(KopeError):
    """The committed kernel fails its own correctness tests, so there is nothing to improve on."""


class ConfigError(KopeError):
    """A command-line or ini option has a value that cannot work."""


class MarkerError(ConfigError):
    """A `pytest.mark.kope(...)` marker names no operator, no source, or a file or folder that is not there."""


class InfrastructureFault(KopeError):
    """A judgement was lost to the machinery, not to the candidate: the worker or node running it died
    (twice, on a retry), or the executor could not reach it. Recorded as such, never as the candidate's crash."""


class ForgeError(KopeError):
    """The forge (GitHub, GitLab) refused a pull-request call for good: bad token, no permission, no such
    repository, or still failing after the retries. Reported for that operator; the run goes on."""


class Interrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, SIGTERM): raised where a judging child would start or was
    killed, so the judgement in progress ends with no verdict. A KeyboardInterrupt, not a KopeError:
    no `except Exception` in the judge mistakes it for a candidate's or a server's failure."""


class GuardViolation(AssertionError):
    """A kernel call broke the oracle's rules (unwritten output, mutated input, FP state left changed)."""


class KernelError(KopeError):
    """A kernel call failed in its kernel server: the kernel's own error, or what the server found it
    left changed (`kind` names it, e.g. GuardViolation); the text is the server's, data only.
    `launches`: the kernel launches the call reported, checked before the error."""

    def __init__(self, message: str, kind: str = "", launches: list[object] | None = None):
        self.kind, self.launches = kind, launches or []
        super().__init__(message)


class KernelDied(KopeError):
    """The kernel server died in a call (a crash, a forbidden system call, out of memory): the kernel's
    fault, reported as a crash."""


class KernelTimeout(KopeError):
    """A kernel call did not return within the judgement's time: the server was killed."""
