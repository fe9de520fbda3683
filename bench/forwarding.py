"""What the kernel-server boundary costs (issue 49): a kernel call forwarded to the process that
serves it, against the same call made in-process, on the sample operators' committed kernels.

    python bench/forwarding.py                  # JSON: bench/results/forwarding.json
    python bench/forwarding.py --ops rowsum --calls 50

For each operator, on the shape of its first correctness test and of its performance test:
- `in-process`: the kernel loaded with cffi here, one call (what a judging child did before);
- `forwarded`: the same call through `judge/kernel` (arguments staged in shared memory and back, the
  server continued and stopped again, its floating-point state checked): what a guarded test call
  costs now;
- `block`: one timed block of one call in the server, as the paired timing makes it (its clock
  brackets the request, the continue and the stop): the part of a timed block that is not the kernel.
And once: starting a kernel server (jailed when bubblewrap works here) and having it load a kernel.
Medians over `--calls`, in microseconds; one machine, other work on it shows in the spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kope.judge.kernel import hosting  # noqa: E402
from pytest_kope.judge.measure import timing  # noqa: E402
from pytest_kope.judge.measure.rotation import Rotation  # noqa: E402
from pytest_kope.operator import Operator  # noqa: E402
from pytest_kope.toolchains.c import CToolchain  # noqa: E402

SHAPES = {  # (small: a correctness call, large: the perf test's), per sample operator: arguments
    "rowsum": ((3, 7), (4096, 4096)),
    "softmax": ((3, 7), (4096, 4096)),
    "gelu": ((21,), (1 << 24,)),
}


def _args(op: str, shape: tuple[int, ...], rng: np.random.Generator) -> tuple[Any, ...]:
    if op == "gelu":
        (n,) = shape
        x = rng.standard_normal(n, dtype=np.float32)
        return x, np.empty_like(x), n
    rows, cols = shape
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    y = np.empty(rows if op == "rowsum" else (rows, cols), dtype=np.float32)
    return x, y, rows, cols


def _median_us(fn: Any, calls: int) -> float:
    took = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1e6


def measure(op_name: str, calls: int, build: Path) -> list[dict[str, Any]]:
    tc = CToolchain()
    op = Operator(op_name, ROOT / "sample_ops" / op_name / f"{op_name}.c", "c", op_name)
    candidate = op.baseline()
    interface = op.build_context(op.spec)
    local = tc.build(candidate, interface, build).functions[op_name].raw
    started = time.perf_counter()
    served: Any = hosting.serve(tc, candidate, interface, build).functions[op_name].raw
    start_ms = (time.perf_counter() - started) * 1e3
    rng = np.random.default_rng(0)
    rows = []
    for which, shape in zip(("test", "perf"), SHAPES[op_name]):
        args = _args(op_name, shape, rng)
        roles = ["in", "out"] + ["scalar"] * (len(args) - 2)
        rotation = Rotation(args, roles, allocate=served.allocate)
        rotation.prepare(rotation.seeds())
        side = timing.Side(served, rotation, served)
        clock = timing.Clock(time.perf_counter, lambda: None)
        n = calls if which == "test" else max(5, calls // 10)
        rows.append(
            {
                "operator": op_name,
                "call": f"{which} {'x'.join(map(str, shape))}",
                "in-process us": _median_us(lambda a=args: local(*a), n),
                "forwarded us": _median_us(lambda a=args: served(*a), n),
                "block us": statistics.median(side.run(0, 1, clock) for _ in range(n)) * 1e6,
                "server start ms": start_ms,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", default=list(SHAPES))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "forwarding.json")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kope-forwarding-") as tmp:
        rows = [row for op in args.ops for row in measure(op, args.calls, Path(tmp))]
    for row in rows:
        row["block - kernel us"] = row["block us"] - row["in-process us"]
    print(tabulate(rows, headers="keys", floatfmt=".1f"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "calls": args.calls}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
