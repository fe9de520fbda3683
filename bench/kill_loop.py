"""Kill an optimize run with SIGKILL at random moments; the graph and the repo must survive every time.

Copies one sample operator (default: rowsum) into a temporary git repo, then 20 times starts
`pytest --kope-optimize --kope-agent tuner --kope-budget 6` (commits on), kills the controller with
SIGKILL after 0.5-8 s, and checks:
- `PRAGMA integrity_check` of .kope/experience.db is 'ok' right after the kill;
- a `kope-worktree-*` worktree a killed run left registered is gone once the next run has started;
- the user's checkout is untouched (HEAD, `git status`).
At the end one run goes to completion; then no candidate may have been judged twice (attempts: one row
per (task, candidate_hash)) and no kope/* branch may hold two commits of the same winner.

Prints a table and writes bench/results/kill_loop.json.

    python bench/kill_loop.py [--iterations 20] [--op rowsum] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tabulate import tabulate

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "sample_ops"
WORKTREE_PREFIX = "kope-worktree-"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def make_repo(root: Path, ops: list[str]) -> Path:
    repo = root / "ops"
    repo.mkdir()
    for op in ops:
        if (SAMPLES / op).is_dir():
            shutil.copytree(SAMPLES / op, repo / op)
    if (SAMPLES / "pytest.ini").exists():
        shutil.copy(SAMPLES / "pytest.ini", repo / "pytest.ini")
    if not any(p.is_dir() for p in repo.iterdir()):  # no such sample op here: a tiny generated one
        (repo / "scale").mkdir()
        (repo / "scale" / "scale.c").write_text(
            "// kope: kernel void scale(const float *x, float *y, long n)\n"
            "// kope: param UNROLL = 1 | 2 | 4 | 8\n"
            "#ifndef UNROLL\n#define UNROLL 1\n#endif\n"
            "void scale(const float *x, float *y, long n) {\n"
            '    _Pragma("GCC unroll 8") for (long i = 0; i < n; i++) y[i] = 2.0f * x[i];\n}\n'
        )
        (repo / "scale" / "test_scale.py").write_text(
            "import numpy as np\nimport pytest\nfrom pytest_kope import assert_close\n\n"
            'pytestmark = pytest.mark.kope("scale", source="scale.c")\n\n'
            '@pytest.mark.parametrize("n", [1, 7, 1000, 4097])\n'
            "def test_scale(kernel, rng, n):\n"
            "    x = rng.standard_normal(n).astype(np.float32)\n    y = np.empty_like(x)\n"
            "    kernel.scale(x, y, n)\n    assert_close(y, 2 * x)\n\n"
            "def test_scale_perf(kernel, rng, kope_bench):\n"
            "    x = rng.standard_normal(1 << 22).astype(np.float32)\n    y = np.empty_like(x)\n"
            "    kope_bench(kernel.scale, x, y, x.size)\n"
        )
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=kill-loop", "-c", "user.email=k@l", "commit", "-q", "-m", "ops")
    return repo


def command(budget: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "--kope-optimize",
        "--kope-agent",
        "tuner",
        "--kope-budget",
        str(budget),
        "-p",
        "no:cacheprovider",
        "-q",
    ]


def integrity(db: Path) -> str:
    if not db.exists():
        return "no db yet"
    con = sqlite3.connect(db)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def attempts(db: Path) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT count(*) FROM attempts").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        con.close()


def worktrees(repo: Path) -> list[str]:
    out = []
    for block in git(repo, "worktree", "list", "--porcelain").split("\n\n"):
        line = block.strip().splitlines()[0] if block.strip() else ""
        path = line.removeprefix("worktree ").strip()
        if WORKTREE_PREFIX in Path(path).name:
            out.append(path)
    return out


def kope_cgroups() -> set[str]:
    """pids cgroups the judge made whose controller is dead (left behind); live runs' are not counted."""
    root = Path("/sys/fs/cgroup/pids")
    out = set()
    for p in root.glob("kope-*-*") if root.is_dir() else []:
        try:
            os.kill(int(p.name.split("-")[1]), 0)
        except ProcessLookupError:
            out.add(p.name)
        except (ValueError, PermissionError):
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--op", action="append", help="sample op(s) to copy (default: rowsum)")
    ap.add_argument("--budget", type=int, default=6)
    ap.add_argument("--min-kill", type=float, default=0.5)
    ap.add_argument("--max-kill", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=str(HERE / "results" / "kill_loop.json"))
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="kope-kill-loop-"))
    repo = make_repo(root, args.op or ["rowsum"])
    head = git(repo, "rev-parse", "HEAD").strip()
    db = repo / ".kope" / "experience.db"
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "PYTEST_ADDOPTS")}
    cgroups_before = kope_cgroups()
    rows: list[dict[str, Any]] = []
    stale: list[str] = []
    ok = True
    for i in range(1, args.iterations + 1):
        at = round(rnd.uniform(args.min_kill, args.max_kill), 2)
        log = open(root / f"run-{i}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(command(args.budget), cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(at)
        finished_first = proc.poll() is not None
        # a killed run's worktrees must be gone once this run got past its start (its header is out)
        started = b"kope: run " in (root / f"run-{i}.log").read_bytes()
        left_over = [w for w in stale if w in worktrees(repo)] if started else []
        if not finished_first:
            os.kill(proc.pid, signal.SIGKILL)  # the controller only, as `kill -9 <pid>` would
        proc.wait()
        log.close()
        check = integrity(db)
        stale = worktrees(repo)
        clean = git(repo, "status", "--porcelain") == "" and git(repo, "rev-parse", "HEAD").strip() == head
        row = {
            "iteration": i,
            "kill_s": at,
            "finished_before_kill": finished_first,
            "integrity": check,
            "attempts": attempts(db),
            "worktrees_left": len(stale),
            "stale_worktrees_after_next_start": len(left_over),
            "checkout_clean": clean,
        }
        ok &= check in ("ok", "no db yet") and not left_over and clean
        rows.append(row)
        print(
            f"{i:3d} kill at {at:5.2f}s integrity={check:8s} attempts={row['attempts']:3d} "
            f"worktrees left={len(stale)} clean={clean}",
            flush=True,
        )
    # one run to completion
    t0 = time.monotonic()
    final = subprocess.run(
        command(args.budget), cwd=repo, env=env, capture_output=True, text=True, timeout=1800
    )
    final_s = time.monotonic() - t0
    (root / "final.log").write_text(final.stdout + final.stderr)
    con = sqlite3.connect(db)
    try:
        final_check = con.execute("PRAGMA integrity_check").fetchone()[0]
        dup_attempts = con.execute(
            "SELECT count(*) FROM (SELECT task_id, candidate_hash FROM attempts "
            "GROUP BY task_id, candidate_hash HAVING count(*) > 1)"
        ).fetchone()[0]
        total_attempts = con.execute("SELECT count(*) FROM attempts").fetchone()[0]
        distinct = con.execute("SELECT count(DISTINCT task_id || candidate_hash) FROM attempts").fetchone()[0]
    finally:
        con.close()
    dup_commits, branch_commits = 0, {}
    for branch in git(repo, "for-each-ref", "--format=%(refname:short)", "refs/heads/kope/").split():
        log_lines = git(
            repo, "log", "--format=%H%x00%(trailers:key=Kope-Candidate,valueonly)", f"{head}..{branch}"
        )
        cands = [ln.split("\0")[1].strip() for ln in log_lines.splitlines() if "\0" in ln]
        branch_commits[branch] = len(cands)
        dup_commits += sum(n - 1 for n in Counter(c for c in cands if c).values())
    remaining_worktrees = worktrees(repo)
    leaked_cgroups = sorted(kope_cgroups() - cgroups_before)
    summary = {
        "final_returncode": final.returncode,
        "final_seconds": round(final_s, 1),
        "final_integrity": final_check,
        "attempts": total_attempts,
        "distinct_attempts": distinct,
        "duplicate_attempts": dup_attempts,
        "kope_branches": branch_commits,
        "duplicate_commits": dup_commits,
        "worktrees_left_after_final": remaining_worktrees,
        "checkout_clean_after_final": git(repo, "status", "--porcelain") == ""
        and git(repo, "rev-parse", "HEAD").strip() == head,
        "cgroups_leaked": leaked_cgroups,
    }
    ok &= (
        final.returncode == 0
        and final_check == "ok"
        and dup_attempts == 0
        and dup_commits == 0
        and not remaining_worktrees
        and summary["checkout_clean_after_final"]
    )
    print()
    print(
        tabulate(
            [
                (
                    r["iteration"],
                    f"{r['kill_s']:.2f}",
                    r["integrity"] + (" (done)" if r["finished_before_kill"] else ""),
                    r["attempts"],
                    r["worktrees_left"],
                    r["stale_worktrees_after_next_start"],
                )
                for r in rows
            ],
            headers=[
                "iteration",
                "kill at (s)",
                "integrity",
                "attempts so far",
                "worktrees left",
                "stale after next start",
            ],
        )
    )
    print()
    print(tabulate(sorted(summary.items()), headers=["final run", ""]))
    print(f"\nkill loop: {'PASS' if ok else 'FAIL'} (repo {repo})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "ok": ok,
                "op": args.op or ["rowsum"],
                "budget": args.budget,
                "iterations": rows,
                "final": summary,
            },
            indent=2,
        )
    )
    if ok:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
