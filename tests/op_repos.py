"""Small real operator repos in tmp dirs, built with the real gcc (a module of its own: every
conftest.py under the testpaths shares the module name `conftest`)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

from pytest_kope.judge.controller import sandbox

# Agents other than the tuner run only in the bubblewrap jail: where it does not work, tests that run
# them say so explicitly (the next layers of defence are still tested).
UNJAILED = [] if sandbox.bubblewrap()[0] else ["--kope-allow-unjailed"]

SCALE_C = """\
// kope: kernel void scale(const float *x, float *y, int n)
// kope: param UNROLL = 1 | 4
// kope: flags -O0 | -O2 -march=native
void scale(const float *x, float *y, int n) {
    int i = 0;
#if UNROLL > 1
    for (; i + UNROLL <= n; i += UNROLL)
        for (int u = 0; u < UNROLL; u++) y[i + u] = 2.0f * x[i + u];
#endif
    for (; i < n; i++) y[i] = 2.0f * x[i];
}
"""

SCALE_TEST = """\
import numpy as np
import pytest
from pytest_kope import assert_close

pytestmark = pytest.mark.kope("scale", source="scale.c", family="elementwise")


@pytest.mark.parametrize("n", [1, 7, 64, 1001])
def test_scale_matches_numpy(kernel, rng, n):
    x = rng.standard_normal(n, dtype=np.float32)
    y = np.empty_like(x)
    kernel.scale(x, y, n)
    assert_close(y, 2 * x, rtol=1e-6)


def test_scale_speed(kernel, kope_bench, rng):
    n = 1 << 20
    x = rng.standard_normal(n, dtype=np.float32)
    y = np.empty_like(x)
    kope_bench(kernel.scale, x, y, n)
"""

INI = "[pytest]\nfilterwarnings = error\n"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_op_repo(
    root: Path, source: str = SCALE_C, test: str = SCALE_TEST, name: str = "scale", commit: bool = True
) -> Path:
    """A one-operator repo: <root>/<name>/<name>.c and test_<name>.py, committed to git."""
    (root / "pytest.ini").write_text(INI)
    op = root / name
    op.mkdir(parents=True, exist_ok=True)
    (op / f"{name}.c").write_text(textwrap.dedent(source))
    (op / f"test_{name}.py").write_text(textwrap.dedent(test))
    if commit:
        git(root, "init", "-q", "-b", "main")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "operators")
    return root


def path_without_bwrap(where: Path) -> str:
    """A PATH with every program on this one but `bwrap`: a machine without bubblewrap, for real."""
    where.mkdir(parents=True, exist_ok=True)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            link = where / entry.name
            if entry.name == "bwrap" or link.is_symlink() or entry.is_dir():
                continue
            if os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    return str(where)
