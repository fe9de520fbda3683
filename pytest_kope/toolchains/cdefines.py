"""A C/C++ winner's parameter values written into the source itself, so the committed file builds the
winner under any build: the repo's own Makefile or CMake, a plain `gcc -c`, pytest-kope's own.

The `kope:` header's first values tell pytest-kope's build the defaults, but no other build reads
that header: a merge that only reordered it would change nothing a Makefile compiles. Each value goes
where the preprocessor sees it with no `-D`: the file's own fallback (`#ifndef NAME` / `#define NAME
v`) is rewritten in place, and every other parameter gets a guarded default in one marked block ahead
of the code. A `-D` on the command line still overrides either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..spec import FLAGS, Scalar

BEGIN = "/* pytest-kope: tuned values; a -D on the command line still overrides them */"
END = "/* pytest-kope: end of tuned values */"
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", re.S)


def write_defines(text: str, point: Mapping[str, Scalar]) -> str:
    """`text` with every parameter of `point` (flags aside) defined as its value when no -D is given."""
    values = {k: str(v) for k, v in point.items() if k != FLAGS}
    text = _BLOCK.sub("", text)
    rest = {}
    for name, value in values.items():
        fallback = re.compile(
            rf"(^[ \t]*#[ \t]*ifndef[ \t]+{name}[ \t]*\n[ \t]*#[ \t]*define[ \t]+{name}[ \t]+)([^\n]*?)([ \t]*(?://[^\n]*|/\*[^\n]*)?$)",
            re.M,
        )
        text, found = fallback.subn(rf"\g<1>{value}\g<3>", text, count=1)
        if not found:
            rest[name] = value
    if not rest:
        return text
    block = "".join(f"#ifndef {n}\n#define {n} {v}\n#endif\n" for n, v in sorted(rest.items()))
    lines = text.splitlines(keepends=True)
    at = _first_code_line(lines)
    return "".join([*lines[:at], f"{BEGIN}\n{block}{END}\n", *lines[at:]])


def _first_code_line(lines: list[str]) -> int:
    """The index of the first line that is neither blank nor only a comment (no macro is used above
    it, so defaults put there are seen by every line that can use them)."""
    in_comment = False
    for i, line in enumerate(lines):
        rest = line.strip()
        while rest:
            if in_comment:
                end = rest.find("*/")
                if end < 0:
                    rest = ""
                    break
                in_comment, rest = False, rest[end + 2 :].strip()
            elif rest.startswith("//"):
                rest = ""
            elif rest.startswith("/*"):
                in_comment, rest = True, rest[2:]
            else:
                return i
    return len(lines)
