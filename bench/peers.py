"""The sample operators next to what a user would pick instead, and next to this machine's roofline.

For each sample operator, in one process, on the same buffers, interleaved: the committed kernel, the
winner on branch `kope/<op>` when the repo has one (built from the branch: `git show kope/<op>:<path>`),
and the kernel-only peers: torch eager with `out=` (or its closest fused call), `torch.compile` writing
into the preallocated output, numpy (OpenBLAS for sgemm). Plus the roofline: copy and read bandwidth
and the FMA peak measured around each operator by the project's physics probe, at the same thread
count, and each contender's fraction of it. Median of interleaved rounds with 95% intervals; a table
and JSON (pytest_kope/peers does the work; `--kope-peers` uses the same code).

ISA: `--isa avx2` measures as an AVX2-only machine would (pytest_kope/peers/isa.py): every kernel and
the roof probe are built with `-mno-avx512f` after their own flags and checked with objdump to hold no
zmm or mask register, and the timing runs in a child process whose environment adds (never replaces)
ATEN_CPU_CAPABILITY=avx2, MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2, OPENBLAS_CORETYPE=Haswell
and NPY_DISABLE_CPU_FEATURES=<numpy's AVX-512 targets>, and a fresh TORCHINDUCTOR_CACHE_DIR unless one
is set (code torch.compile cached for the native ISA is not reused); the child checks that torch, numpy and OpenBLAS
report what was asked and stops otherwise. A variable the user set to another value stops the bench.

Threads: every contender gets the CPUs this process may use (`--threads` to choose): torch through
torch.set_num_threads, OpenBLAS through its own set_num_threads, the probe through its child's
OMP_NUM_THREADS; a kernel uses the THREADS its tuning point declares (at most that many). Nothing in
the environment is unset; OMP_WAIT_POLICY is set to passive (as the judge times) only when unset.

    python bench/peers.py [--repo sample_ops] [--ops softmax,sgemm] [--rounds 15] [--isa native|avx2] [--no-compile]
                          [--out bench/results/peers.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's pytest_kope, not whichever one is installed

from pytest_kope.hardware import cpu_fingerprint  # noqa: E402 - after the path
from pytest_kope.peers import (  # noqa: E402 - after the path
    CASES,
    ISAS,
    Comparison,
    Setup,
    compare,
    default_threads,
    headline,
    import_torch,
    isa,
    missing_env,
    peer_report,
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


def in_isa_child(name: str) -> dict[str, str]:
    """The environment variables this process runs under for `--isa name`: when some are missing,
    this bench runs again in a child with them added (torch and numpy read them at import) and this
    process exits with the child's status."""
    chosen = isa(name)
    try:
        missing = missing_env(chosen, dict(os.environ))
    except ValueError as e:
        sys.exit(str(e))
    if missing and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # torch.compile's shared cache served code that left half of rowsum's rows unwritten under
        # ATEN_CPU_CAPABILITY=avx2 (seen here; a fresh cache compiled it right): the child gets its own
        missing["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kope-peers-inductor-")
    if missing:
        said = " ".join(f"{k}={v!r}" for k, v in missing.items())
        print(f"--isa {name}: timing in a child with {said}", flush=True)
        sys.exit(subprocess.run([sys.executable, *sys.argv], env={**os.environ, **missing}).returncode)
    return chosen.env


def arguments() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repo", default=str(ROOT / "sample_ops"), help="an operator repo laid out as sample_ops"
    )
    parser.add_argument("--ops", default=",".join(CASES))
    parser.add_argument("--branch-prefix", default="kope/")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="default: the CPUs this process may use")
    parser.add_argument("--isa", choices=ISAS, default="native", help="measure as a machine with this ISA")
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="leave out the torch.compile peers (first compiles: 10-60 s)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "peers.json"))
    return parser.parse_args()


def measure(args: argparse.Namespace, torch: Any, threads: int) -> list[Comparison]:
    """Each operator's committed kernel (and winner on its branch) next to its peers."""
    repo = Path(args.repo).resolve()
    build_dir = Path(tempfile.mkdtemp(prefix="kope-peers-"))
    results = []
    for op in args.ops.split(","):
        source = repo / op / f"{op}.c"
        kernels = [("committed", source.read_text(), source.name, source.parent)]
        winner = branch_source(repo, args.branch_prefix + op, source)
        if winner is not None:
            kernels.append((f"winner ({args.branch_prefix}{op})", winner, source.name, source.parent))
        setup = Setup(threads=threads, rounds=args.rounds, isa_name=args.isa, compiled=not args.no_compile)
        r = compare(CASES[op], kernels, build_dir, setup, torch=torch, log=print)
        results.append(r)
        print(f"{op}: {r.seconds:.0f} s", flush=True)
    return results


def main() -> None:
    """Time every operator's committed kernel and winner next to the peers; print a table, write JSON."""
    args = arguments()
    isa_env = in_isa_child(args.isa)
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    threads = args.threads or default_threads()
    torch = import_torch()
    isa_seen, wrong = peer_report(isa(args.isa), torch)
    if wrong:
        sys.exit(f"--isa {args.isa}: " + "; ".join(wrong))
    set_by = use_threads(threads, torch)
    start = time.monotonic()
    results = measure(args, torch, threads)
    wall = time.monotonic() - start
    ver = versions(torch)
    cpu = cpu_fingerprint()
    print(
        f"\n{cpu['model']} ({cpu['arch']}, {cpu['simd_level']}), {threads} threads"
        f" ({'; '.join(set_by) or 'no peers'}), OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']},"
        f" {args.rounds} interleaved rounds; torch {ver['torch']}, numpy {ver['numpy']}; {wall:.0f} s"
    )
    flags = " ".join(isa(args.isa).cflags) or "their own flags only"
    seen = ", ".join(f"{k} {v}" for k, v in isa_seen.items())
    env = ", ".join(f"{k}={v}" for k, v in isa_env.items()) or "nothing"
    print(
        f"ISA {args.isa}: kernels and roof probe built with {flags}; set for the peers: {env}; they report {seen}"
    )
    print(table(results))
    print()
    for r in results:
        label = next((t.label for t in r.timed if t.label.startswith("winner")), "committed")
        print(headline(r, label))
    isa_json = {
        "name": args.isa,
        "cflags": list(isa(args.isa).cflags),
        "env": isa_env,
        "peers_report": isa_seen,
    }
    data = {
        "machine": cpu, "isa": isa_json, "threads": threads, "thread_settings": set_by,
        "omp_wait_policy": os.environ["OMP_WAIT_POLICY"], "rounds": args.rounds, "versions": ver,
        "wall_s": wall, "repo": str(Path(args.repo).resolve()), "operators": [r.to_json() for r in results],
    }  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
