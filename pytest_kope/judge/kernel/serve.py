"""The kernel server: the only process that loads a candidate's code, and all it does is serve calls.

Started jailed by a test host (`process.py`) with its channels as inherited descriptors
(`python -m pytest_kope.judge.kernel.serve FD[,FD...]`). The first message on the first channel says
what to load. Before loading anything of the candidate it makes itself non-dumpable and installs the
first seccomp filter; after a compiled library is loaded, the second (`seccomp.py`). Then every
channel is served by a thread of its own: `call` runs one call on arguments in the shared arena,
`sets` and `block` run a timed block of calls on argument sets named once, `state` says what the
calls left changed in the process (floating-point control state in any thread, thread counts, torch
and numpy settings). It decides nothing: the host reads the outputs and keeps the clock.

Imports only the standard library and cffi on the path of a compiled kernel (a server starts in
~50 ms), plus the toolchain's own modules for Python kernels (Triton).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import callmodes, redzones
from .wire import Channel, Closed

if TYPE_CHECKING:
    from ..child.procstate import Snapshot

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
MAX_TEXT = 2000


class Server:
    """One loaded kernel and the arena its host shares with it."""

    def __init__(self) -> None:
        self.maps: dict[int, tuple[mmap.mmap, int]] = {}  # segment id -> mapping, its address
        self.functions: dict[str, Callable[..., Any]] = {}
        self.sets: dict[int, tuple[Callable[..., Any], list[tuple[Any, ...]]]] = {}
        self.convert: Callable[[dict[str, Any]], Any] = self._pointer
        self.snapshot: Snapshot | None = None  # after loading: what calls must leave as it was
        self.launches: Callable[[], list[Any]] | None = None  # the launches a call made, for the host
        self.fp_checked = False
        self.sanitized = False  # every array copied into memory the sanitizer watches (`redzones`)

    # -- loading ------------------------------------------------------------------------------------
    def load(self, spec: dict[str, Any]) -> dict[str, Any]:
        from . import seccomp

        notes = []
        _prctl(PR_SET_DUMPABLE, 0)
        _prctl(PR_SET_PDEATHSIG, 9)  # outlives no host, jailed or not
        if spec.get("fpstate_lib"):
            from ..child import fpstate

            fpstate.use_helper(spec["fpstate_lib"])
        if spec["kind"] == "toolchain":
            self._import_toolchain(spec)  # torch, triton: trusted imports before the filter
        if spec.get("seccomp", True) and (why := seccomp.no_escape(os.getpid())):
            notes.append(why)
        if spec["kind"] == "cffi":
            reentrant = self._load_library(spec)
            self.sanitized = bool(spec.get("sanitize"))
            if spec.get("seccomp", True) and (why := seccomp.no_new_code()):
                notes.append(why)
        else:
            reentrant = self._load_toolchain(spec)
        from ..child import procstate

        self.snapshot = procstate.Snapshot.take()
        return {"ok": True, "functions": sorted(self.functions), "reentrant": reentrant, "notes": notes}

    def _load_library(self, spec: dict[str, Any]) -> bool:
        import cffi

        from ..child import fpstate

        ffi = cffi.FFI()
        ffi.cdef("\n".join(p.rstrip(";") + ";" for p in spec["prototypes"]))
        before = fpstate.read()
        lib = ffi.dlopen(spec["library"])
        after = fpstate.read()
        if before is not None and after is not None and (before ^ after) & fpstate.CONTROL_MASK:
            raise LoadRefused(
                f"loading the library changed the floating-point control state (MXCSR {before:#06x} -> "
                f"{after:#06x}, e.g. FTZ/DAZ from -ffast-math's crtfastmath.o); drop -ffast-math/-Ofast"
            )
        for name in spec["names"]:
            try:
                self.functions[name] = getattr(lib, name)
            except AttributeError:
                raise LoadRefused(f"the library does not export kernel {name}()") from None
        self.ffi = ffi
        self.convert = self._pointer
        return True

    def _import_toolchain(self, spec: dict[str, Any]) -> None:
        import importlib

        os.environ.update(spec.get("environment", {}))  # e.g. TRITON_INTERPRET=1 before triton loads
        module, _, cls = spec["factory"].partition(":")
        try:
            made = importlib.import_module(module)
        except ImportError:  # a toolchain of a repo's conftest: its file, under a name of its own
            import importlib.util

            found = importlib.util.spec_from_file_location(f"kope_toolchain_{module}", spec["factory_file"])
            assert found is not None and found.loader is not None
            made = importlib.util.module_from_spec(found)
            found.loader.exec_module(made)
        self.toolchain = getattr(made, cls)()
        for name in spec.get("imports", []):
            importlib.import_module(name)

    def _load_toolchain(self, spec: dict[str, Any]) -> bool:
        from dataclasses import replace

        from ...candidate import Candidate
        from ...spec import parse_spec

        candidate = Candidate.from_json(spec["candidate"])
        own = parse_spec(
            candidate.source, candidate.filename
        )  # its tuning space; the interface is the host's
        interface = replace(own, kernels=tuple(spec["kernels"]), inplace=frozenset(spec["inplace"]))
        kernel = self.toolchain.build(candidate, interface, spec["build_dir"])
        self.functions = {name: f.raw for name, f in kernel.functions.items()}
        self.launches = kernel.extra.get("launches")  # what the host's Ascend lowering check takes
        self.convert = self._array
        return all(f.reentrant for f in kernel.functions.values())

    # -- arguments ------------------------------------------------------------------------------------
    def _pointer(self, arg: dict[str, Any]) -> Any:
        if "s" in arg:
            return arg["s"]
        _, base = self.maps[arg["seg"]]
        return self.ffi.cast("void *", base + arg["off"])

    def _array(self, arg: dict[str, Any]) -> Any:
        if "s" in arg:
            return arg["s"]
        mm, _ = self.maps[arg["seg"]]
        if arg["lib"] == "torch":
            import torch

            dtype = getattr(torch, arg["dtype"])
            span = max(1, arg["span"])
            flat = torch.frombuffer(mm, dtype=dtype, count=span, offset=arg["off"])
            t = flat.as_strided(arg["shape"], arg["strides"])
            return t.requires_grad_(True) if arg.get("grad") else t
        import numpy as np

        dtype = np.dtype(arg["dtype"])
        count = int(np.prod(arg["shape"], dtype=np.int64))
        return np.frombuffer(mm, dtype=dtype, count=count, offset=arg["off"]).reshape(arg["shape"])

    @contextmanager
    def arguments(self, args: list[dict[str, Any]]) -> Iterator[list[Any]]:
        """A call's arguments: in the arena, or for a sanitized kernel, copied out of it (`redzones`)."""
        if not self.sanitized:
            yield [self.convert(a) for a in args]
            return
        with redzones.copied(args, lambda a: self.maps[a["seg"]][1] + a["off"], self._address) as values:
            yield values

    def _address(self, address: int) -> Any:
        return self.ffi.cast("void *", address)

    # -- serving --------------------------------------------------------------------------------------
    def handle(self, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        op = message["op"]
        if op == "map":
            mm = mmap.mmap(fds[0], message["size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            os.close(fds[0])
            self.maps[message["id"]] = (mm, ctypes.addressof(ctypes.c_char.from_buffer(mm)))
            return {"ok": True}
        if op == "unmap":
            self.sets.clear()  # argument sets point into the heap being dropped
            for id in message["ids"]:
                self.maps.pop(id, None)  # the mapping goes with its last view
            return {"ok": True}
        if op == "call":
            fn = self.functions[message["fn"]]
            with callmodes.entered(message.get("modes")), self.arguments(message["args"]) as values:
                fn(*values)
            return self._reported(self._state("fp") if message.get("check") else {"ok": True})
        if op == "sets":  # each argument once, its copies' places in lists
            fn, columns = self.functions[message["fn"]], message["columns"]
            count = max((len(c["segs"]) for c in columns if "segs" in c), default=1)
            sets = [
                tuple(
                    self.convert(dict(c, seg=c["segs"][k], off=c["offs"][k]) if "segs" in c else c)
                    for c in columns
                )
                for k in range(count)
            ]
            self.sets[message["id"]] = (fn, sets)
            return {"ok": True}
        if op == "block":
            fn, sets = self.sets[message["sets"]]
            k, start = len(sets), message["start"]
            for i in range(message["n"]):
                fn(*sets[(start + i) % k])
            return self._reported({"ok": True})
        if op == "state":
            return self._state("all")
        raise ValueError(f"unknown request {op!r}")

    def _reported(self, answer: dict[str, Any]) -> dict[str, Any]:
        """`answer` with the launches the kernel made since the last answer (the host checks them)."""
        launches = self.launches() if self.launches is not None else []
        return {**answer, "launches": launches} if launches else answer

    def _state(self, what: str) -> dict[str, Any]:
        """What the calls since the last look left changed ("fp": the FP control state only)."""
        from ..child import fpstate

        if self.snapshot is None:  # reported as the request's error, as any other
            raise LookupError("no kernel is loaded: nothing to compare the state with")
        found = fpstate.changes(self.snapshot.fp) if what == "fp" else self.snapshot.changes()
        return {"ok": True, "changed": found}

    def serve(self, channel: Channel) -> None:
        while True:
            try:
                message, fds = channel.recv()
            except Closed:
                return
            try:
                answer = self.handle(message, fds)
            except Exception as e:  # noqa: BLE001 - the kernel's own error, reported as data
                answer = self._reported({"error": _text(e), "kind": type(e).__name__})
            channel.reply(message, answer)


class LoadRefused(Exception):
    """The kernel cannot be served as built (a missing symbol, FP state changed at load)."""


def _text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:MAX_TEXT]


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def main(argv: list[str]) -> int:
    """Load what the first message says, then serve every channel until its host closes it."""
    channels = [Channel.from_fd(int(fd)) for fd in argv[1].split(",")]
    server, first = Server(), channels[0]
    try:
        spec, _ = first.recv()
    except Closed:
        return 0
    try:
        first.reply(spec, server.load(spec["load"]))
    except Exception as e:  # noqa: BLE001 - a kernel that cannot be loaded: said, then nothing is served
        trace = traceback.format_exc()[-MAX_TEXT:]
        first.reply(spec, {"error": _text(e), "kind": type(e).__name__, "trace": trace})
        return 3
    for extra in channels[1:]:
        threading.Thread(target=server.serve, args=(extra,), daemon=True).start()
    server.serve(first)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv))
