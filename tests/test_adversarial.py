"""A hard oracle and a safe sandbox: candidates that cheat or attack must never be crowned.

A tiny operator repo (row softmax in plain C, a correctness test over several shapes and a perf test)
is built in a temporary git repo, and every file in tests/adversarial/softmax/ is judged by a real
`pytest --kope-optimize --kope-agent replay:DIR` run in a subprocess, as a user would run it. One trick
per file; each test below asserts one trick's outcome (and message) from the run's report.json.

Two runs, each judging many tricks at once to keep the suite fast:
- `main`: every defense on. Tricks that escape the name screen are refused by the check of the built
  library (imports, raw system-call instructions).
- `deep`: the same judge with the built-library check switched off (KOPE_C_SCREEN_BINARY=0), so the
  tricks that issue raw system calls actually run, and what is tested is the next layer: the guards,
  the bubblewrap jail (read-only view, no network, PID namespace), the pids cgroup and the scrubbed
  environment. Jail-dependent assertions skip with a reason on a machine without bubblewrap/cgroup.
Replayed candidates run only in the jail, so without bubblewrap both runs pass --kope-allow-unjailed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_kope.judge.controller import sandbox

TRICKS = Path(__file__).parent / "adversarial" / "softmax"
FAKE_KEY = "sk-ant-kope-FAKE-a7c3e9d1f00d4b2c"
NOT_CORRECT = {"incorrect", "crashed", "timeout", "rejected", "compile_failed", "runtime_failed"}
OUTSIDE = [
    Path("/tmp/kope-pwned-by-candidate"),
    Path("/tmp/kope-pwned-by-candidate-rel"),
]
DEEP = ["thread_escape", "forkbomb_raw", "env_proc_raw", "write_outside", "delete_repo", "forge_results"]
DEFUSED = {"content_cache"}  # tricks the judge makes pointless rather than catches
X86 = platform.machine() in ("x86_64", "AMD64")

JAIL, JAIL_WHY = sandbox.bubblewrap()
if JAIL is None:  # only the jail stops these once they run: without it they would wreck the deep run's repo
    DEEP = [n for n in DEEP if n not in ("write_outside", "delete_repo")]
CGROUP = sandbox.pids_cgroup_root()
needs_jail = pytest.mark.skipif(JAIL is None, reason=f"no bubblewrap jail here: {JAIL_WHY}")
needs_cgroup = pytest.mark.skipif(CGROUP is None, reason="no writable pids cgroup here")
needs_x86 = pytest.mark.skipif(not X86, reason="raw-syscall tricks are written for x86-64")

KERNEL = """\
// kope: kernel void softmax(const float *x, float *y, int rows, int cols)
#include <math.h>

void softmax(const float *x, float *y, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (long)r * cols;
        float *yr = y + (long)r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int c = 0; c < cols; c++)
            m = xr[c] > m ? xr[c] : m;
        for (int c = 0; c < cols; c++) {
            yr[c] = expf(xr[c] - m);
            s += yr[c];
        }
        for (int c = 0; c < cols; c++)
            yr[c] = yr[c] / s;
    }
}
"""

# The reference is computed from x *after* the call, as tests naturally do: the input guard (and the
# operator owning the interface) must keep a kernel from rewriting x to match its own output.
TESTS = """\
import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("softmax", source="softmax.c", family="rowwise")
SHAPES = [(1, 1), (2, 8), (3, 7), (4, 33), (16, 64), (5, 1000), (2, 4099)]


def reference(x):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("rows,cols", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_softmax_matches_reference(kernel, rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    y = np.empty_like(x)
    kernel.softmax(x, y, rows, cols)
    assert_close(y, reference(x), rtol=1e-5)


def test_softmax_perf(kernel, rng, kope_bench):
    x = (rng.standard_normal((64, 1024)) * 3).astype(np.float32)
    y = np.empty_like(x)
    kope_bench(kernel.softmax, x, y, 64, 1024)
"""
TEST_IDS = [
    f"test_softmax.py::test_softmax_matches_reference[{r}x{c}]"
    for r, c in [(1, 1), (2, 8), (3, 7), (4, 33), (16, 64), (5, 1000), (2, 4099)]
]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def _fingerprint(repo: Path) -> dict[str, str]:
    """Content hash of every file in the repo outside .kope/ (and .git's objects stay checked by git)."""
    out = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if (
            p.is_file()
            and rel.parts[0] != ".kope"
            and not (rel.parts[0] == ".git" and "objects" in rel.parts)
        ):
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _make_repo(root: Path) -> Path:
    repo = root / "ops"
    repo.mkdir()
    (repo / "softmax.c").write_text(KERNEL)
    (repo / "test_softmax.py").write_text(TESTS)
    (repo / "pytest.ini").write_text("[pytest]\nfilterwarnings = error\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "softmax")
    return repo


def _agent_dir(root: Path, repo: Path, names: list[str]) -> Path:
    folder = root / "agent" / "softmax"
    folder.mkdir(parents=True)
    tests = ", ".join(f'"{t}"' for t in TEST_IDS)
    for name in names:
        text = (TRICKS / f"{name}.c").read_text().replace("@REPO@", str(repo)).replace("@TESTS@", tests)
        (folder / f"{name}.c").write_text(text)
    return folder.parent


class Run:
    """One optimize run over some tricks, and everything the assertions need from it."""

    def __init__(self, root: Path, names: list[str], extra_env: dict[str, str], args: tuple[str, ...] = ()):
        for p in OUTSIDE:
            p.unlink(missing_ok=True)
        self.repo = _make_repo(root)
        self.head = _git(self.repo, "rev-parse", "HEAD").strip()
        self.files = _fingerprint(self.repo)
        agent = _agent_dir(root, self.repo, names)
        env = {**os.environ, "ANTHROPIC_API_KEY": FAKE_KEY, **extra_env}
        env.pop("PYTEST_ADDOPTS", None)
        cmd = [sys.executable, "-m", "pytest", "--kope-optimize", f"--kope-agent=replay:{agent}"]
        cmd += ["--kope-budget", str(len(names)), "--kope-timeout", "10", "--kope-jobs", "3"]
        cmd += ["--kope-seeds", "2", "-p", "no:cacheprovider", "-p", "no:randomly"]
        cmd += args
        if JAIL is None:  # replayed candidates run only in the jail unless allowed: test the next layers
            cmd.append("--kope-allow-unjailed")
        self.proc = subprocess.run(cmd, cwd=self.repo, env=env, capture_output=True, text=True, timeout=600)
        self.output = self.proc.stdout + self.proc.stderr
        runs = sorted((self.repo / ".kope" / "runs").glob("*/report.json"))
        assert runs, f"no report was written\n{self.output[-4000:]}"
        self.run_dir = runs[-1].parent
        self.report = json.loads(runs[-1].read_text())
        (op,) = self.report["operators"]
        self.op = op
        self.by_name: dict[str, dict[str, Any]] = {}
        for c in op.get("candidates", []):
            m = re.match(r"replayed (\w+)\.c", c["idea"])
            if m:
                self.by_name[m.group(1)] = c

    def outcome(self, name: str) -> dict[str, Any]:
        assert name in self.by_name, (
            f"{name} was not judged; judged: {sorted(self.by_name)}\n{self.output[-3000:]}"
        )
        return self.by_name[name]

    def log(self, name: str) -> str:
        short = self.outcome(name)["id"][:8]
        path = self.run_dir / "softmax" / short / "correctness.log"
        return path.read_text(errors="replace") if path.exists() else ""


ALL = sorted(p.stem for p in TRICKS.glob("*.c"))
MAIN = [n for n in ALL if X86 or n not in ("forkbomb_raw", "env_proc_raw", "write_outside", "delete_repo")]


@pytest.fixture(scope="module")
def main(tmp_path_factory) -> Run:
    return Run(tmp_path_factory.mktemp("main"), MAIN, {})


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> Run:
    if not X86:
        pytest.skip("the deep run's raw-syscall tricks are written for x86-64")
    return Run(tmp_path_factory.mktemp("deep"), ["control_ok", *DEEP], {"KOPE_C_SCREEN_BINARY": "0"})


def _assert_failed(run: Run, name: str, outcomes: set[str], pattern: str) -> None:
    c = run.outcome(name)
    text = "\n".join(c["failures"])
    assert c["outcome"] in outcomes, f"{name}: {c['outcome']}: {text[:1500]}"
    assert re.search(pattern, text, re.I | re.S), f"{name}: {c['outcome']}: message {text[:1500]!r}"


# -- the run as a whole ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["main", "deep"])
def test_run_completes_and_leaves_repo_and_graph_intact(request, which):
    run: Run = request.getfixturevalue(which)
    assert run.proc.returncode == 0, run.output[-4000:]
    assert _git(run.repo, "rev-parse", "HEAD").strip() == run.head
    assert _git(run.repo, "status", "--porcelain") == ""
    assert _fingerprint(run.repo) == run.files
    db = sqlite3.connect(run.repo / ".kope" / "experience.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()


@pytest.mark.parametrize("which", ["main", "deep"])
def test_no_trick_is_crowned(request, which):
    run: Run = request.getfixturevalue(which)
    tricks = {c["id"] for n, c in run.by_name.items() if n != "control_ok"}
    assert run.op["best"]["id"] not in tricks
    for name, c in run.by_name.items():
        if name in DEFUSED:  # its trick never fires: it runs as the honest kernel it wraps, uncrowned
            assert c["outcome"] != "better", c
        elif name != "control_ok":
            assert c["outcome"] in NOT_CORRECT, (name, c["outcome"], c["failures"][:1])
    for branch in _git(run.repo, "for-each-ref", "--format=%(refname)", "refs/heads/kope/").split():
        body = _git(run.repo, "log", "-1", "--format=%B", branch)
        assert not any(t in body for t in tricks), body


@pytest.mark.parametrize("which", ["main", "deep"])
def test_control_candidate_is_accepted(request, which):
    """Without this, a judge that fails everything would pass the whole suite."""
    run: Run = request.getfixturevalue(which)
    c = run.outcome("control_ok")
    assert c["outcome"] in ("ok", "better"), c["failures"]


@pytest.mark.parametrize("which", ["main", "deep"])
def test_api_key_never_seen(request, which):
    run: Run = request.getfixturevalue(which)
    if which == "deep" and JAIL is None:
        pytest.skip(
            f"reading the parent's /proc/<pid>/environ is stopped only by the PID namespace: {JAIL_WHY}"
        )
    assert FAKE_KEY not in json.dumps(run.report)
    for p in run.repo.joinpath(".kope").rglob("*"):
        if p.is_file():
            assert FAKE_KEY.encode() not in p.read_bytes(), f"the key leaked into {p}"
    assert FAKE_KEY not in run.output
    objects = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=run.repo, capture_output=True, check=True
    ).stdout
    assert FAKE_KEY.encode() not in objects, "the key reached a git object"


# -- the oracle ------------------------------------------------------------------------------------


def test_stale_output_nothing_written(main):
    _assert_failed(main, "stale_nothing", {"incorrect"}, r"unwritten")


def test_stale_output_partly_written(main):
    _assert_failed(main, "stale_partial", {"incorrect"}, r"unwritten")


def test_input_mutation(main):
    _assert_failed(main, "input_mutation", {"incorrect"}, r"modified input 'x'")


def test_interface_redeclared_to_mutate_input(main):
    """A candidate cannot re-declare x as non-const/in-place: the interface is the operator's."""
    _assert_failed(main, "inplace_redeclared", {"rejected"}, r"interface stays the committed one")


# -- timing that cannot be gamed ---------------------------------------------------------------------


def test_content_keyed_cache_never_hits_a_timed_call(main):
    """Every timed round sees inputs no call saw before: a cache of the last input never hits, so
    the trick times like the honest kernel it wraps and is not crowned."""
    c = main.outcome("content_cache")
    assert c["outcome"] in {"ok", "incorrect", "suspect"}, c
    assert (c.get("speedup") or 0) < 3, c


def test_structure_keyed_cache_is_caught(main):
    _assert_failed(
        main,
        "structure_cache",
        NOT_CORRECT | {"suspect"},
        r"timed outputs differ|unwritten|beyond|differential check",
    )


def test_stale_output_on_rotation_is_caught(main):
    # a forwarded call stages its arrays at one place a call: the second large call finds its x "seen"
    _assert_failed(
        main, "stale_rotation", NOT_CORRECT | {"suspect"}, r"timed outputs differ|beyond|unwritten"
    )


# -- the committed kernel as a reference ---------------------------------------------------------------


def test_overflow_on_large_inputs_is_caught(main):
    _assert_failed(main, "overflow_large", {"incorrect"}, r"differential check.*scaled x1000.*non-finite")


def test_data_race_is_caught(main):
    _assert_failed(main, "race_omp", {"incorrect"}, r"max error|differ|non-finite|stale result")


# -- nothing a candidate writes is executed or trusted by the controller ------------------------------


def test_glibc_alias_refused_by_library_allow_list(main):
    _assert_failed(main, "glibc_alias", {"rejected"}, r"imports .*__open")


def test_pointer_keyed_cache(main):
    _assert_failed(main, "pointer_cache", {"incorrect"}, r"stale result .*address|max error")


def test_wrong_tail_on_unseen_shapes(main):
    _assert_failed(main, "wrong_tail", {"incorrect"}, r"max error")


def test_nan_output(main):
    _assert_failed(main, "nan_output", {"incorrect"}, r"non-finite")


def test_lower_precision(main):
    _assert_failed(main, "low_precision", {"incorrect"}, r"max error .* > ")


def test_fp_state_ftz_daz(main):
    _assert_failed(main, "mxcsr_ftz", {"incorrect"}, r"floating-point control state")


def test_openmp_task_cannot_outlive_the_call(main):
    _assert_failed(main, "thread_omp_nowait", {"incorrect"}, r"max error")


def test_thread_by_name_is_screened(main):
    _assert_failed(main, "thread_screened", {"rejected"}, r"screening: .*pthread_create")


def test_thread_past_name_screen_refused_by_library_check(main):
    _assert_failed(main, "thread_escape", {"rejected"}, r"screening: .*imports [^(]*\bthrd_create\b")


def test_thread_still_writing_after_return(deep):
    """With the library check off, the C11 thread runs: the guard's second look must catch it."""
    # a write that lands after the guard's settle window (a loaded machine) fails the test's own check
    # (a max error, seen in CI through Ray), or, writing into a buffer freed after the call, it brings
    # its own process down
    _assert_failed(
        deep,
        "thread_escape",
        {"incorrect", "crashed"},
        r"changed after the call returned|non-finite|killed by|max error",
    )


def test_forged_results_refused(main):
    _assert_failed(main, "forge_results", {"rejected"}, r"screening: .*imports .*write")


def test_forged_results_not_believed(deep):
    """With the library check off the forger runs: its fake 'passed' lines must not make it correct."""
    # it runs in a kernel server: its lines reach only its own channel, which the host does not believe
    _assert_failed(
        deep, "forge_results", NOT_CORRECT, r"forged|without finishing|wrote on its channel|exited"
    )


# -- crashes and limits ------------------------------------------------------------------------------


def test_segfault(main):
    _assert_failed(main, "segfault", {"crashed"}, r"SIGSEGV")


def test_infinite_loop(main):
    _assert_failed(main, "infinite_loop", {"timeout"}, r"wall-clock limit")


def test_huge_malloc_is_the_kernels_own_problem(main):
    # No address-space rlimit (a kernel could tell the judge by it): 64 GiB is refused as it would be
    # for the user (overcommit: more than RAM and swap) and the kernel traps (SIGILL), or, on a machine
    # that grants it, it writes nothing ('unwritten'); either way it is the kernel's fault
    _assert_failed(main, "huge_malloc", {"crashed", "incorrect"}, r"SIGILL|unwritten")


def test_fork_bomb_by_name_is_screened(main):
    _assert_failed(main, "forkbomb_screened", {"rejected"}, r"screening: .*fork")


def test_fork_bomb_pasted_name_refused_by_library_check(main):
    _assert_failed(main, "forkbomb_fnptr", {"rejected"}, r"screening: .*imports [^(]*\bfork\b")


@needs_x86
def test_fork_bomb_raw_syscall_refused_by_library_check(main):
    _assert_failed(main, "forkbomb_raw", {"rejected"}, r"screening: .*raw system calls")


@needs_cgroup
def test_fork_bomb_raw_syscall_contained(deep):
    # a kernel server may start no process: the first fork ends it (seccomp), the candidate's fault
    _assert_failed(deep, "forkbomb_raw", {"crashed"}, r"SIGSYS.*forbids")
    assert "kope-forkbomb: made" not in deep.log("forkbomb_raw")


# -- secrets and the filesystem ----------------------------------------------------------------------


def test_getenv_is_screened(main):
    _assert_failed(main, "env_getenv", {"rejected"}, r"screening: .*getenv")


def test_getenv_pasted_name_refused_by_library_check(main):
    _assert_failed(main, "env_getenv_fnptr", {"rejected"}, r"screening: .*imports [^(]*\bgetenv\b")


@needs_x86
def test_environ_raw_read_refused_by_library_check(main):
    _assert_failed(main, "env_proc_raw", {"rejected"}, r"screening: .*raw system calls")


def test_environ_raw_read_sees_no_key(deep):
    """It runs, reads /proc/self/environ and its parent's: it crashes, and the key is nowhere (above)."""
    _assert_failed(deep, "env_proc_raw", {"crashed"}, r"SIGSEGV|wrote on its channel")
    if JAIL is None:
        pytest.skip(f"its parent's environ is hidden only by the PID namespace: {JAIL_WHY}")
    assert "PATH=" in deep.log("env_proc_raw")  # it did read an environment: the scrubbed one


def test_delete_repo_files_by_name_is_screened(main):
    _assert_failed(main, "delete_repo_screened", {"rejected"}, r"screening: .*(unlink|remove)")


def test_header_payload_is_never_run(main):
    """A `kope: require` that would run a shell command is refused by the header's grammar, not run."""
    _assert_failed(
        main, "require_payload", NOT_CORRECT, r"softmax\.c:3: `kope: require` allows only .*a call"
    )
    assert not Path(f"{main.repo}.require-pwned").exists()


@needs_jail
def test_write_outside_its_dir_fails(deep):
    _assert_failed(deep, "write_outside", {"incorrect"}, r"unwritten")
    assert not (deep.repo / "PWNED_BY_CANDIDATE").exists()
    for p in OUTSIDE:
        assert not p.exists(), f"the candidate wrote {p}"


@needs_jail
def test_delete_repo_files_fails(deep):
    _assert_failed(deep, "delete_repo", {"incorrect"}, r"unwritten")
    assert (deep.repo / "softmax.c").read_text() == KERNEL
    assert (deep.repo / ".git").is_dir() and not (deep.repo / ".git-gone").exists()


def test_every_trick_file_is_asserted():
    """A trick file added to tests/adversarial/ without a test here would be judged but never checked."""
    source = Path(__file__).read_text()
    unchecked = [n for n in ALL if n != "control_ok" and f'"{n}"' not in source]
    assert not unchecked, unchecked
