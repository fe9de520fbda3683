"""C prototypes: a kernel's arguments and their roles read from its `kope: kernel` line, and what a
call of it may pass (numpy arrays of the declared types, C-contiguous; scalars)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..errors import SpecError
from .base import IN, OUT, SCALAR, Arg

_NUMPY_OF = {
    "float": "float32", "double": "float64", "int": "int32", "int32_t": "int32", "int64_t": "int64",
    "long": "int64", "uint8_t": "uint8", "int8_t": "int8", "short": "int16", "uint16_t": "uint16",
    "unsigned": "uint32", "uint32_t": "uint32", "size_t": "uint64",
}  # fmt: skip


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


def numpy_caller(
    ffi: Any, fn: Any, name: str, args: tuple[Arg, ...], dtypes: list[str]
) -> Callable[..., Any]:
    """Wrap a cffi function so it takes numpy arrays for pointers, checking dtype and contiguity."""
    check = argument_check(name, args, dtypes)
    pointers = [a.role != SCALAR for a in args]

    def call(*values: Any) -> Any:
        check(values)
        return fn(
            *(
                ffi.cast("void *", v.ctypes.data) if pointer else (v.item() if hasattr(v, "item") else v)
                for pointer, v in zip(pointers, values)
            )
        )

    call.__name__ = name
    return call


def argument_check(name: str, args: tuple[Arg, ...], dtypes: list[str]) -> Callable[[tuple[Any, ...]], None]:
    """What a kernel of this prototype takes: as many arguments, C-contiguous numpy arrays of the
    declared dtypes for its pointers (in a test host, checked before a call is forwarded)."""
    import numpy as np

    pointer_dtypes = iter(dtypes)
    plan = [(a, next(pointer_dtypes) if a.role != SCALAR else None) for a in args]

    def check(values: tuple[Any, ...]) -> None:
        if len(values) != len(plan):
            raise TypeError(f"{name}() takes {len(plan)} arguments ({len(values)} given)")
        for (arg, dtype), value in zip(plan, values):
            if dtype is None:
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

    return check
