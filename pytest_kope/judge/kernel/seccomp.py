"""The system calls a kernel server may not make, enforced by the Linux kernel (libseccomp, through
ctypes: no build step, and libseccomp2 is on every Debian/Ubuntu-like system).

Two filters, each installed by the server on itself and kept for good (filters stack, none can be
lifted). Before the kernel is loaded: no socket of any family and no connection, no new process
(threads are allowed: `clone` only with CLONE_THREAD, `clone3` answers ENOSYS so libc falls back to
`clone`), no program started, no tracing or reading another process's memory, no signal to any process
but itself, no io_uring (it makes socket calls no filter sees), no new namespace or mount. After a
compiled kernel is loaded (`no_new_code`): no mapping or protection change that adds execute
permission, so no code is made or changed from then on. A forbidden call kills the whole server
(SIGSYS), which its host reports as the candidate's fault.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence

ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
CLONE_THREAD = 0x00010000
PROT_EXEC = 0x4
SHM_EXEC = 0o100000
# enum scmp_compare
NE, EQ, MASKED_EQ = 1, 4, 7

NEVER = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "fork", "vfork", "execve", "execveat",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd", "pidfd_send_signal",
    "kcmp", "tkill", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_by_handle_at",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
)  # fmt: skip
SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: a pid


class Arg(ctypes.Structure):
    """libseccomp's `struct scmp_arg_cmp`: one condition on one system-call argument."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


def _library() -> ctypes.CDLL | None:
    try:  # by its soname: ctypes.util.find_library would start a process (ldconfig)
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Arg)
    ]  # fmt: skip
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


class Filter:
    """One filter being built: `deny` rules on top of allow-everything, then `load`."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.ctx = lib.seccomp_init(ALLOW)
        if not self.ctx:
            raise OSError("seccomp_init failed")

    def deny(self, name: str, *conditions: tuple[int, int, int, int], action: int = KILL_PROCESS) -> None:
        """Kill the process on `name` (when every condition `(arg, op, a, b)` holds); a call this
        machine's kernel does not have is skipped."""
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return
        args = (Arg * max(1, len(conditions)))(*(Arg(*c) for c in conditions))
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(conditions), args)
        if rc < 0:
            raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")

    def load(self) -> None:
        try:
            rc = self.lib.seccomp_load(self.ctx)
            if rc < 0:
                raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
        finally:
            self.lib.seccomp_release(self.ctx)


def available() -> bool:
    """Whether the filters can be installed here (libseccomp is there)."""
    return _library() is not None


def no_escape(pid: int) -> str:
    """Install the first filter on this process ("" when installed, else why not)."""
    lib = _library()
    if lib is None:
        return "no seccomp filter: libseccomp.so.2 not found (apt-get install libseccomp2)"
    f = Filter(lib)
    for name in NEVER:
        f.deny(name)
    f.deny("clone", (0, MASKED_EQ, CLONE_THREAD, 0))  # a new process, not a thread
    f.deny("clone3", action=0x00050000 | errno.ENOSYS)  # its flags are out of reach: libc falls back
    for name in SELF_ONLY:
        f.deny(name, (0, NE, pid, 0))
    f.load()
    return ""


def no_new_code() -> str:
    """Install the second filter: no memory made executable from now on."""
    lib = _library()
    if lib is None:
        return "no seccomp filter: libseccomp.so.2 not found"
    f = Filter(lib)
    for name, arg in (("mmap", 2), ("mprotect", 2), ("pkey_mprotect", 2)):
        f.deny(name, (arg, MASKED_EQ, PROT_EXEC, PROT_EXEC))
    f.deny("shmat", (2, MASKED_EQ, SHM_EXEC, SHM_EXEC))
    f.load()
    return ""


def denied_names() -> Sequence[str]:
    """What the filters forbid, for the README and the run header."""
    return (*NEVER, "clone without CLONE_THREAD", *(f"{n} to another process" for n in SELF_ONLY))
