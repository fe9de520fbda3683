"""A kernel built by the repo's own command (`pytest.mark.kope(build=..., library=..., root=...)`):
CMake, make, setup.py, run in a copy of the build root with the candidate's source in place.

The command is the repo's, never a candidate's; the candidate's flags and defines reach it as
`{cflags}` and in CFLAGS/CXXFLAGS. A library it makes is screened like a gcc build and cached by
the content of the whole tree.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from ..candidate import Candidate
from ..errors import BuildError, LibraryRejected
from ..spec import FLAGS, KernelSpec
from . import tools
from .flagblock import BASELINE_ENV, BASELINE_FLAGS, dispatches


def own_build(
    candidate: Candidate, spec: KernelSpec, build_dir: Path, screen: Callable[[Path], list[str]]
) -> tuple[Path, str]:
    """Build with the repo's own command (CMake, make, setup.py) in a copy of its build root, with the
    candidate's source in place of the committed one; cached by content like a gcc build.

    The command comes from the repo's marker, never from a candidate. The candidate's flags and
    defines reach it as `{cflags}` in the command and as CFLAGS/CXXFLAGS in its environment.
    """
    command, root, target, library = spec.build or ("", "", "", "")
    cflags = _cflags(candidate)
    key = own_build_key(candidate, spec)
    done = build_dir / key
    if (done / "kernel.so").exists():
        return done / "kernel.so", (done / "build.log").read_text()
    tmp = build_dir / f".{key}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tree = tmp / "tree"
    shutil.copytree(root, tree, ignore=shutil.ignore_patterns(*_NOT_COPIED))
    (tree / target).write_text(candidate.source)
    env = {**os.environ, "CFLAGS": cflags, "CXXFLAGS": cflags, "KOPE_CFLAGS": cflags}
    run = with_cflags(command, cflags)
    try:
        proc = tools.run(["sh", "-c", run], tree, 600, env=env)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(
            candidate.filename, f"the repo's build command timed out after 600 s: {run}"
        ) from None
    log = (proc.stdout + proc.stderr).replace(str(tree) + "/", "")
    built = tree / library
    if proc.returncode != 0 or not built.is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        why = "" if proc.returncode else f"\nit exited 0 but made no {library}; fix library= in the marker"
        raise BuildError(candidate.filename, f"$ {run}\n{log[-6000:]}{why}")
    if os.environ.get(BASELINE_ENV) and dispatches(built):
        shutil.rmtree(tmp, ignore_errors=True)
        raise BuildError(
            candidate.filename,
            f"$ {run}\nheld to the baseline instruction set ({' '.join(BASELINE_FLAGS)}), the library still "
            "dispatches target clones: the build passes neither {cflags} nor CFLAGS to the compiler; "
            "put {cflags} in the marker's build= so the fallback can be tested",
        )
    shutil.copy(built, tmp / "kernel.so")
    (tmp / "build.log").write_text(log)
    shutil.rmtree(tree, ignore_errors=True)
    keep_screened(tmp, done, screen, candidate.filename)
    return done / "kernel.so", log


def keep_screened(tmp: Path, target: Path, screen: Callable[[Path], list[str]], filename: str) -> None:
    """Move a fresh build into the cache once its library passes the screen; refuse it otherwise."""
    reasons = screen(tmp / "kernel.so")
    if reasons:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LibraryRejected(filename, "screening: " + "; ".join(reasons))
    try:
        tmp.rename(target)
    except OSError:  # another process built the same key first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)


def with_cflags(command: str, cflags: str) -> str:
    """`command` with `{cflags}` filled in as the shell reads it where it stands: one quoted word
    (`cmake -DCMAKE_C_FLAGS={cflags}`), or, inside double quotes, the flags themselves with the
    shell's specials escaped (`make CFLAGS="-Wall {cflags}"`: a quoted word there would reach the
    compiler with its quotes)."""
    parts = command.split("{cflags}")
    out = parts[0]
    for part in parts[1:]:
        inside = _open_double_quote(out)
        out += (re.sub(r'([$`"\\])', r"\\\1", cflags) if inside else shlex.quote(cflags)) + part
    return out


def _open_double_quote(text: str) -> bool:
    """Whether `text` (shell words) ends inside a double-quoted string."""
    inside_double = inside_single = escaped = False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and not inside_single:
            escaped = True
        elif ch == "'" and not inside_double:
            inside_single = not inside_single
        elif ch == '"' and not inside_single:
            inside_double = not inside_double
    return inside_double


def _cflags(candidate: Candidate) -> str:
    flags = shlex.split(str(candidate.params.get(FLAGS, "-O2")))
    return " ".join([*flags, *(f"-D{k}={v}" for k, v in sorted(candidate.params.items()) if k != FLAGS)])


def own_build_key(candidate: Candidate, spec: KernelSpec) -> str:
    """The cache key of a build by the repo's own command: the candidate, the command and the tree."""
    command, root, target, library = spec.build or ("", "", "", "")
    tree_files = sorted(
        p for p in Path(root).rglob("*") if p.is_file() and not (set(p.relative_to(root).parts) & _NOT_COPIED)
    )
    parts = [candidate.source, command, _cflags(candidate), library, target]
    digest = hashlib.sha256("\0".join(parts).encode())
    for f in tree_files[:2000]:
        digest.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes()[: 1 << 20])
    return "own-" + digest.hexdigest()[:20]


_NOT_COPIED = {".git", ".kope", "__pycache__", ".pytest_cache", "build"}
