"""The sample operators next to what a user would pick instead, and next to this machine's roofline.

For each sample operator, in one process, on the same buffers, interleaved: the committed kernel, the
winner on branch `kope/<op>` when the repo has one (built from the branch: `git show kope/<op>:<path>`),
and the kernel-only peers: torch eager with `out=` (or its closest fused call), `torch.compile` writing
into the preallocated output, numpy (OpenBLAS for sgemm). Plus the roofline: copy and read bandwidth
and the FMA peak measured around each operator by the project's physics probe, at the same thread
count, and each contender's fraction of it. Median of interleaved rounds with 95% intervals; a table
and JSON (pytest_kope/peers does the work; `--kope-peers` uses the same code).

Threads: every contender gets the CPUs this process may use (`--threads` to choose): torch through
torch.set_num_threads, OpenBLAS through its own set_num_threads, the probe through its child's
OMP_NUM_THREADS; a kernel uses the THREADS its tuning point declares (at most that many). Nothing in
the environment is unset; OMP_WAIT_POLICY is set to passive (as the judge times) only when unset.

    python bench/peers.py [--repo sample_ops] [--ops softmax,sgemm] [--rounds 15] [--out bench/results/peers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's pytest_kope, not whichever one is installed

from pytest_kope.peers import (  # noqa: E402 - after the path
    CASES,
    compare,
    default_threads,
    headline,
    import_torch,
    table,
    use_threads,
    versions,
)


def branch_source(repo: Path, branch: str, source: Path) -> str | None:
    """The kernel source as committed on `branch`, or None when there is no such branch."""
    top = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True, text=True
    ).stdout.strip()
    if not top:
        return None
    rel = source.resolve().relative_to(Path(top).resolve())
    proc = subprocess.run(
        ["git", "-C", top, "show", f"{branch}:{rel.as_posix()}"], capture_output=True, text=True
    )
    return proc.stdout if proc.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repo", default=str(ROOT / "sample_ops"), help="an operator repo laid out as sample_ops"
    )
    parser.add_argument("--ops", default=",".join(CASES))
    parser.add_argument("--branch-prefix", default="kope/")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="default: the CPUs this process may use")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "peers.json"))
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    threads = args.threads or default_threads()
    torch = import_torch()
    set_by = use_threads(threads, torch)
    repo = Path(args.repo).resolve()
    build_dir = Path(tempfile.mkdtemp(prefix="kope-peers-"))
    start = time.monotonic()
    results = []
    for op in args.ops.split(","):
        source = repo / op / f"{op}.c"
        kernels = [("committed", source.read_text(), source.name, source.parent)]
        winner = branch_source(repo, args.branch_prefix + op, source)
        if winner is not None:
            kernels.append((f"winner ({args.branch_prefix}{op})", winner, source.name, source.parent))
        r = compare(CASES[op], kernels, build_dir, threads, rounds=args.rounds, torch=torch, log=print)
        results.append(r)
        print(f"{op}: {r.seconds:.0f} s", flush=True)
    wall = time.monotonic() - start
    ver = versions(torch)
    print(
        f"\n{platform.processor() or platform.machine()}, {threads} threads ({'; '.join(set_by) or 'no peers'}),"
        f" OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, {args.rounds} interleaved rounds;"
        f" torch {ver['torch']}, numpy {ver['numpy']}; {wall:.0f} s"
    )
    print(table(results))
    print()
    for r in results:
        label = next((t.label for t in r.timed if t.label.startswith("winner")), "committed")
        print(headline(r, label))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "threads": threads,
                "thread_settings": set_by,
                "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
                "rounds": args.rounds,
                "versions": ver,
                "wall_s": wall,
                "repo": str(repo),
                "operators": [r.to_json() for r in results],
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
