"""Each kernel function's arguments and their roles, read from the committed interface by the host.

The roles (which arguments are inputs the guards keep unchanged, which outputs they poison) are the
oracle's, never a kernel server's say: a toolchain that declares them (`kernel_args`) is asked; for
any other, the committed `kope: kernel` lines are read as C prototypes where they are ones, else as
the Python declaration (`pylaunch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SpecError
from ..spec import KernelSpec
from .base import INOUT, OUT, Arg
from .cproto import parse_prototype
from .pylaunch import kernel_args as python_args

if TYPE_CHECKING:
    from .base import Toolchain


def kernel_args(tc: Toolchain, spec: KernelSpec, where: str) -> dict[str, tuple[Arg, ...]]:
    """`tc`'s own reading where it has one, else the C grammar, else the Python one."""
    own = getattr(tc, "kernel_args", None)
    if own is not None:
        found: dict[str, tuple[Arg, ...]] = own(spec, where)
        return found
    try:
        parsed = [parse_prototype(proto) for proto in spec.kernels]
    except SpecError:
        return python_args(spec, where)
    return {
        name: tuple(Arg(a.name, INOUT) if a.name in spec.inplace and a.role == OUT else a for a in args)
        for name, args, _ in parsed
    }
