"""Screens for untrusted kernel sources and the libraries built from them, shared by every toolchain
and the claude agent. Three layers, each a first filter (the judge's jailed child process is the
containment):

- `c_source`: C/C++ sources, one comment stripper and one list of forbidden names;
- `library`: built C/C++ libraries, an allow-list of imported symbols and no system-call instructions;
- `python_source`: Python (Triton) sources, an allow-list of imports and no way to the interpreter.
"""

from __future__ import annotations

from .c_source import FORBIDDEN_CALLS, compiler_flag_ok, forbidden_c_names, screen_c_source, strip_c_comments
from .library import (
    ALLOW_SYMBOLS_INI,
    ALLOWED_SYMBOLS,
    BINARY_SCREEN_ENV,
    library_imports,
    screen_library,
    symbol_allowed,
)
from .python_source import ALLOWED_MODULES, FORBIDDEN_ATTRS, FORBIDDEN_BUILTINS, screen_python_source

__all__ = [
    "ALLOWED_MODULES",
    "ALLOWED_SYMBOLS",
    "ALLOW_SYMBOLS_INI",
    "BINARY_SCREEN_ENV",
    "FORBIDDEN_ATTRS",
    "FORBIDDEN_BUILTINS",
    "FORBIDDEN_CALLS",
    "compiler_flag_ok",
    "forbidden_c_names",
    "library_imports",
    "screen_c_source",
    "screen_library",
    "screen_python_source",
    "strip_c_comments",
    "symbol_allowed",
]
