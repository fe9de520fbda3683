"""Every launch of a Triton kernel under the interpreter, whatever wraps it, described as data.

A lowering check that wraps module attributes misses kernels reached another way: through
``@triton.heuristics`` or ``@triton.autotune`` (objects of other types, which launch the kernel's
``run`` themselves), through an alias, or from a helper. All of those end in one place, the
interpreter's ``GridExecutor.__call__`` (community triton 3.x and triton-ascend 3.2 alike), which is
where a grid of programs is actually run. `install` wraps that method once per process, so each
launch is described (`Launch`) and handed to the observer watching the kernel's module, or else to
the observer of the launcher being called (`watching`), before the kernel runs.

A `Launch` is what a compile of the launch depends on: the kernel, each argument's Triton type and
the specialisation Triton applies (pointers aligned to 16 bytes; integers equal to 1 or divisible by
16), the constexpr values and the launch options. It is plain JSON, so a kernel server can report it
to its host, which checks it without loading the kernel (`ascend_lowering`).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Observer = Callable[["Launch"], None]
_DTYPES = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "i1",
}  # fmt: skip
_SCALARS = (bool, int, float, str, type(None))
_LOCK = threading.Lock()
_BY_MODULE: dict[str, Observer] = {}  # a loaded kernel module's name (unique per load) -> its check
_ACTIVE: list[Observer] = []  # the checks of the launchers being called, innermost last


@dataclass(frozen=True)
class Launch:
    """One launch: `args` holds (name, Triton type, specialisation) per runtime argument, where the
    specialisation is "16" (aligned or divisible by 16), "1" (an integer equal to 1) or ""."""

    kernel: str
    module: str
    args: tuple[tuple[str, str, str], ...]
    constants: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...] = ()
    file: str = ""  # the module's file in the launching process (an in-process check reads it)

    def key(self) -> tuple[Any, ...]:
        """What a compile depends on, for one module's text."""
        return (self.kernel, self.args, self.constants, self.options)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "module": self.module,
            "args": [list(a) for a in self.args],
            "constants": [list(c) for c in self.constants],
            "options": [list(o) for o in self.options],
        }

    @classmethod
    def from_json(cls, data: Any) -> Launch:
        """A launch reported by a kernel server: checked to be the shape `to_json` writes (ValueError)."""
        try:
            args = tuple((str(n), str(t), str(s)) for n, t, s in data["args"])
            constants = tuple((str(n), _scalar(v)) for n, v in data["constants"])
            options = tuple((str(n), _scalar(v)) for n, v in data["options"])
            return cls(str(data["kernel"]), str(data["module"]), args, constants, options)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a kernel launch: {str(data)[:200]}") from e


def _scalar(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    raise ValueError(f"{value!r} is not a JSON scalar")


def describe(fn: Any, arg_names: list[str], constexprs: list[str], args: Any, kwargs: Any) -> Launch:
    """The launch of Python function `fn` (the interpreter's, defined in the kernel's module) on
    `args` and `kwargs`; TypeError for an argument Triton cannot take."""
    params = {k: v for k, v in kwargs.items() if k in arg_names}
    options = tuple(
        sorted((k, v) for k, v in kwargs.items() if k not in arg_names and k not in ("grid", "warmup"))
    )
    bound = inspect.signature(fn).bind(*args, **params)
    bound.apply_defaults()
    runtime, constants = [], []
    for name, value in bound.arguments.items():
        if name in constexprs:
            constants.append((name, _constant(value)))
        else:
            runtime.append((name, *_triton_type(value)))
    module = fn.__globals__
    return Launch(
        fn.__name__,
        str(module.get("__name__", "")),
        tuple(runtime),
        tuple(constants),
        tuple((k, v) for k, v in options if isinstance(v, _SCALARS)),
        str(module.get("__file__", "") or ""),
    )


def _constant(value: Any) -> Any:
    value = getattr(value, "value", value)  # tl.constexpr(...)
    if isinstance(value, _SCALARS):
        return value
    if type(value).__name__ == "dtype" and hasattr(value, "name"):  # tl.float32 as a constexpr
        return f"tl.{value.name}"
    raise TypeError(f"a constexpr of type {type(value).__name__} cannot be described for the check")


def _triton_type(value: Any) -> tuple[str, str]:
    """(Triton type, specialisation) of one runtime argument, as Triton's launcher decides them."""
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        name = str(value.dtype).rsplit(".", 1)[-1]
        if name not in _DTYPES:
            raise TypeError(f"no Triton pointer type for tensor dtype {value.dtype}")
        return "*" + _DTYPES[name], "16" if value.data_ptr() % 16 == 0 else ""
    if value is None:
        return "none", ""
    if isinstance(value, bool):
        return "i1", ""
    if isinstance(value, int):
        kind = "i32" if -(2**31) <= value < 2**31 else "i64" if -(2**63) <= value < 2**63 else "u64"
        return kind, "1" if value == 1 else "16" if value % 16 == 0 else ""
    if isinstance(value, float):
        return "fp32", ""
    raise TypeError(f"cannot pass {type(value).__name__} to a Triton kernel")


def install() -> bool:
    """Route every interpreted launch in this process to its observer; False without the interpreter."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = interpreter.GridExecutor
    with _LOCK:
        if getattr(executor, "_kope_launches", False):
            return True
        original = executor.__call__

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # a test's failure shows the check's line, not these frames
            if not kwargs.get("warmup", False):
                _observe(self, args, kwargs)
            return original(self, *args, **kwargs)

        executor.__call__ = call
        executor._kope_launches = True
    return True


def _observe(executor: Any, args: Any, kwargs: Any) -> None:
    __tracebackhide__ = True
    fn = executor.fn
    module = str(getattr(fn, "__globals__", {}).get("__name__", ""))
    observer = _BY_MODULE.get(module) or (_ACTIVE[-1] if _ACTIVE else None)
    if observer is not None:
        observer(describe(fn, list(executor.arg_names), list(executor.constexprs), args, kwargs))


def watch(module: str, observer: Observer) -> None:
    """Hand every launch of a kernel defined in `module` to `observer`."""
    _BY_MODULE[module] = observer


@contextlib.contextmanager
def watching(observer: Observer) -> Iterator[None]:
    """Hand `observer` the launches of kernels of other modules made meanwhile (a launcher's call)."""
    _ACTIVE.append(observer)
    try:
        yield
    finally:
        _ACTIVE.remove(observer)
