"""The `compile_draft` check of a C/C++ draft: built as the judge builds it, in the judge's sandbox.

A draft is untrusted text, and a compiler reads whatever it is told to: `#include "/proc/self/environ"`
in the controller would quote its environment (and the API key) back to the model. So:
- an `#include` (or `#include_next`, `#import`, `#embed`, `__has_include`) of an absolute path or of a
  path with `..`, or of a macro, is refused before any compiler runs;
- the toolchain's own screening (forbidden calls, flags, defines) applies as it does to a candidate;
- the toolchain's own command line runs as a sandboxed child (`sandbox.run`: the bubblewrap jail where
  it works, rlimits, a time-out, a scrubbed environment, a fresh temp dir as cwd and HOME);
- what comes back is trimmed and has the temp dir's path removed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...candidate import Candidate
from ...errors import SpecError
from ...spec import parse_spec
from ...toolchains.screening import strip_c_comments
from . import sandbox

OUTPUT_CHARS = 4_000
_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(include_next|include|import|embed)\b[ \t]*(.*)$", re.M)
_HAS_INCLUDE = re.compile(r"__has_(include_next|include|embed)\s*\(\s*([^)\n]*)")


@dataclass(frozen=True)
class Checked:
    """The verdict of a compile check on a draft: ok, the compiler output, or why it was not run."""

    ok: bool
    reason: str = ""  # written here (a refusal, a time-out): safe to show as it is
    output: str = ""  # the compiler's messages: produced from the draft, untrusted


def check(source: str, filename: str, timeout: float = 20.0, cc: str | None = None) -> Checked:
    """Screen and build a C/C++ draft in the sandbox; never raises for anything the draft does."""
    from ...toolchains.c import CToolchain

    filename = Path(filename).name or "draft.c"
    refused = unsafe_include(source)
    if refused:
        return Checked(False, refused)
    try:
        params = dict(parse_spec(source, filename).space.defaults)
    except SpecError as e:
        return Checked(False, f"the `kope:` header does not parse: {e}")
    toolchain = CToolchain(cc=cc)
    candidate = Candidate(source, filename, "c", params=params)
    reasons = toolchain.screen(candidate)
    if reasons:
        return Checked(False, "the judge would reject this source: " + "; ".join(reasons))
    cmd = toolchain.command(candidate, Path(filename), Path("draft.so"))
    if shutil.which(cmd[0]) is None:
        return Checked(False, f"{cmd[0]} is not installed here; submit the source and the judge builds it")
    with tempfile.TemporaryDirectory(prefix="kope-draft-") as tmp:
        work = Path(tmp).resolve()
        (work / filename).write_text(source)
        env = sandbox.scrubbed_environment({"LC_ALL": "C"}, work)
        limits = sandbox.Limits(wall_s=timeout, cpu_s=max(1, int(timeout) + 1), file_size=256 << 20)
        done = sandbox.run(cmd, work, env, limits, sandbox.Children())  # seconds, within the agent's call
    output = _clean(done.output, (tmp, str(work)))
    if done.timed_out:
        return Checked(False, f"the compile check timed out after {timeout:g} s")
    if done.returncode != 0 and not output:
        return Checked(False, f"{Path(cmd[0]).name} exited with {done.returncode}")
    return Checked(done.returncode == 0, output=output)


def unsafe_include(source: str) -> str | None:
    """Why a draft's includes are refused (one line), or None.

    Reads the source as the preprocessor would in the ways that matter here (trigraphs, digraphs,
    line splices, comments, string literals), so `#/**/include`, `%:include` and `#inc\\<newline>lude`
    are seen too. Only a header named literally, by a relative path without `..`, is allowed.
    """
    text = _directive_view(source)
    found = [(f"#{m.group(1)}", m.group(2)) for m in _DIRECTIVE.finditer(text)]
    found += [(f"__has_{m.group(1)}", m.group(2)) for m in _HAS_INCLUDE.finditer(text)]
    for directive, rest in found:
        rest = rest.strip()
        m = re.match(r'"([^"\n]*)"|<([^>\n]*)>', rest)
        if not m:
            return (
                f"`{directive} {rest[:60]}` is refused: name the header literally "
                '(`#include "x.h"` or `#include <x.h>`)'
            )
        path = m.group(1) if m.group(1) is not None else m.group(2)
        if path.strip().startswith("/") or ".." in path:
            return (
                f"`{directive} {m.group(0)[:80]}` is refused: a draft may name headers only by a relative "
                "path without `..`"
            )
    return None


def _directive_view(source: str) -> str:
    """The source with trigraphs and digraphs for `#` and `\\` mapped, lines spliced, comments blanked."""
    text = source.replace("??=", "#").replace("??/", "\\").replace("%:", "#").replace("\r\n", "\n")
    return strip_c_comments(text)


def _clean(output: str, paths: tuple[str, ...]) -> str:
    for path in sorted(set(paths), key=len, reverse=True):
        output = output.replace(path + os.sep, "").replace(path, ".")
    output = output.strip()
    if len(output) > OUTPUT_CHARS:
        output = output[:OUTPUT_CHARS].rstrip() + f"\n[... {len(output) - OUTPUT_CHARS} chars clipped]"
    return output
