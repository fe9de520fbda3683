"""`python -m pytest_kope.peers --op softmax --kernel committed=a.c --kernel winner=b.c --json out.json`

Times the kernels given (the first is the reference output) against the operator's peers and writes
one JSON object (a `Comparison`, plus versions). The plugin's `--kope-peers` runs this in a child so
the controller never loads a kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import CASES, Setup, compare, default_threads, import_torch, use_threads, versions


def main(argv: list[str] | None = None) -> int:
    """Time one operator's winner next to its peers and print the result as JSON (the jailed child)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kope.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--op", required=True, choices=sorted(CASES))
    parser.add_argument(
        "--kernel", action="append", required=True, help="LABEL=PATH, the first is the reference"
    )
    parser.add_argument("--include", help="the operator's source folder (default: each kernel's own)")
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args(argv)
    # the C toolchain's setting for timing (OpenMP workers wait passively), unless the user chose one
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    threads = args.threads or default_threads()
    torch = import_torch()
    use_threads(threads, torch)
    kernels = []
    for item in args.kernel:
        label, _, path = item.rpartition("=")
        source = Path(path)
        folder = Path(args.include) if args.include else source.parent
        kernels.append((label, source.read_text(), source.name, folder))
    setup = Setup(threads=threads, rounds=args.rounds)
    result = compare(CASES[args.op], kernels, Path(args.build_dir), setup, torch=torch)
    Path(args.json).write_text(json.dumps({**result.to_json(), "versions": versions(torch)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
