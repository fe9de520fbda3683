"""Ascend on a CPU as a new user meets it: install, select once, check every kernel, reject held-out ones.

In a fresh venv (no `--system-site-packages`: community triton must not be seen), as the README says:
`pip install '<this checkout>[ascend]'` alone (the toolchain must name the one command still
missing), then `pip install torch==2.13.0` (torch's CPU wheel). Then, on copies of
`sample_ops_triton/`:
- plain `pytest` without a selection (the one-line notice that it runs on plain triton),
- plain `pytest --kope-toolchain triton-ascend` (every sample kernel lowered at its launches),
- `pytest --kope-check --kope-toolchain triton-ascend` (the same through judging children and
  kernel servers: the committed kernels pass),
- `kope judge OP <a copy of the sample kernel>` for each sample: judged `ok` (exit 0),
- each kernel of `bench/ascend_heldout/`, by `kope judge gelu FILE`, and as gelu's committed kernel
  by plain `pytest` and by `--kope-check`: each must be rejected by the lowering check, in one line.

Prints a table and writes JSON. `--python PY` uses an existing environment instead of a fresh venv
(no install steps): the smoke test runs it so in triton-ascend's venv.

    python bench/ascend_install.py [--ops gelu,softmax] [--held-out where_plain,fp64] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = ROOT / "bench" / "ascend_heldout"
OPS = ("gelu", "softmax", "layernorm", "rmsnorm", "sgemm")
AVAILABILITY = (
    "from pytest_kope.toolchains.triton_ascend import TritonAscendToolchain as T; a = T().availability(); "
    "print(('available: ' if a.ok else 'unavailable: ') + a.reason)"
)
FAILS = "does not lower for Ascend"


def run(cmd: list[str], cwd: Path, timeout: float = 1800) -> tuple[float, subprocess.CompletedProcess[str]]:
    """`cmd` with this checkout off the path (what is tested is what pip installed), timed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "VIRTUAL_ENV")}
    began = time.monotonic()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - began, done


def install(work: Path, rows: list[dict[str, Any]]) -> str:
    """A fresh venv, the project with [ascend] only, then torch: the python it gives."""
    venv = work / "venv"
    seconds, done = run([sys.executable, "-m", "venv", str(venv)], work)
    python = str(venv / "bin" / "python")
    for step, args in (
        ("pip install '<checkout>[ascend]'", [f"{ROOT}[ascend]"]),
        ("pip install torch==2.13.0", ["torch==2.13.0"]),
    ):
        seconds, done = run([python, "-m", "pip", "install", "-q", *args], work)
        if done.returncode != 0:
            raise SystemExit(f"{step} failed: {done.stderr.strip()[-2000:]}")
        _, said = run([python, "-c", AVAILABILITY], work)
        rows.append({"step": step, "seconds": round(seconds, 1), "result": said.stdout.strip()})
    return python


def pytest_run(python: str, repo: Path, *args: str) -> tuple[float, str]:
    seconds, done = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], repo)
    return seconds, done.stdout + done.stderr


def summary(output: str) -> str:
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1].strip("= ") if lines else output.strip().splitlines()[-1] if output.strip() else "?"


def samples(python: str, work: Path, ops: list[str], rows: list[dict[str, Any]]) -> None:
    repo = work / "samples"
    shutil.copytree(ROOT / "sample_ops_triton", repo)
    paths = [op for op in ops]
    seconds, out = pytest_run(python, repo, *paths)
    notice = next((line for line in out.splitlines() if "run on toolchain 'triton'" in line), "(no notice)")
    rows.append({"step": "pytest (no selection)", "seconds": round(seconds, 1), "result": notice})
    seconds, out = pytest_run(python, repo, "--kope-toolchain", "triton-ascend", *paths)
    rows.append(
        {
            "step": "pytest --kope-toolchain triton-ascend",
            "seconds": round(seconds, 1),
            "result": summary(out),
        }
    )
    chosen = [a for op in ops for a in ("--kope-operator", op)]
    seconds, out = pytest_run(python, repo, "--kope-check", "--kope-toolchain", "triton-ascend", *chosen)
    ready = next((line for line in out.splitlines() if "ready to optimize" in line), summary(out))
    rows.append(
        {
            "step": "pytest --kope-check --kope-toolchain triton-ascend",
            "seconds": round(seconds, 1),
            "result": ready,
        }
    )


def sample_judges(python: str, work: Path, ops: list[str], rows: list[dict[str, Any]]) -> None:
    """Each sample kernel as a candidate (a copy: the committed file itself is the baseline)."""
    repo = work / "samples"
    for op in ops:
        copy = work / f"{op}-copy.py"
        copy.write_text((repo / op / f"{op}.py").read_text() + "# a copy, judged as a candidate\n")
        seconds, code, line = judge(python, repo, op, copy)
        result = f"exit {code}: {line}"
        rows.append(
            {
                "step": f"kope judge {op} (sample copy)",
                "seconds": round(seconds, 1),
                "result": result,
                "passes": code == 0,
            }
        )


def judge(python: str, repo: Path, op: str, file: Path) -> tuple[float, int, str]:
    """`kope judge OP FILE --kope-toolchain triton-ascend`: seconds, exit status, its verdict line."""
    cli = [python, "-m", "pytest_kope.cli", "judge", op, str(file), "--kope-toolchain", "triton-ascend"]
    seconds, done = run(cli, repo)
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("kope judge:")]
    return seconds, done.returncode, (said[-1] if said else summary(done.stdout + done.stderr))[12:]


def held_out(python: str, work: Path, names: list[str], rows: list[dict[str, Any]]) -> None:
    for name in names:
        repo = work / f"held-{name}"
        shutil.copytree(ROOT / "sample_ops_triton", repo)
        seconds, code, line = judge(python, repo, "gelu", HELD_OUT / f"{name}.py")
        rejected = code == 1 and "compile_failed" in line and FAILS in line
        rows.append(
            {
                "step": f"held out {name}: kope judge",
                "seconds": round(seconds, 1),
                "result": f"exit {code}: {_line(line) if rejected else line}",
                "rejected": rejected,
            }
        )
        shutil.copy(HELD_OUT / f"{name}.py", repo / "gelu" / "gelu.py")
        seconds, out = pytest_run(python, repo, "--kope-toolchain", "triton-ascend", "gelu")
        lines = [line for line in out.splitlines() if FAILS in line]
        first = _line(lines[0]) if lines else "not rejected: " + summary(out)
        rows.append(
            {
                "step": f"held out {name}: pytest",
                "seconds": round(seconds, 1),
                "result": f"{summary(out)}; {first}",
                "rejected": bool(lines),
            }
        )
        args = ("--kope-check", "--kope-toolchain", "triton-ascend", "--kope-operator", "gelu")
        seconds, out = pytest_run(python, repo, *args)
        verdict = next((line for line in out.splitlines() if line.startswith("kope gelu:")), "")
        rejected = verdict.startswith("kope gelu: does not compile:") and FAILS in verdict
        rows.append(
            {
                "step": f"held out {name}: --kope-check",
                "seconds": round(seconds, 1),
                "result": f"does not compile: {_line(verdict)}" if rejected else verdict or summary(out),
                "rejected": rejected,
            }
        )


def _line(text: str) -> str:
    """The lowering check's own line out of a pytest failure line."""
    at = text.find("kernel ")
    return text[at:] if at >= 0 else text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", help="an environment with triton-ascend to use instead of a fresh venv")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--held-out", default=",".join(sorted(p.stem for p in HELD_OUT.glob("*.py"))))
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "ascend_install.json")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kope-ascend-") as tmp:
        work = Path(tmp)
        python = args.python or install(work, rows)
        samples(python, work, args.ops.split(","), rows)
        sample_judges(python, work, args.ops.split(","), rows)
        held_out(python, work, [n for n in args.held_out.split(",") if n], rows)
    print(tabulate([[r["step"], r["seconds"], r["result"][:160]] for r in rows], ["step", "s", "result"]))
    held = [r for r in rows if "rejected" in r]
    judged = [r for r in rows if "passes" in r]
    print(f"held-out kernels rejected: {sum(r['rejected'] for r in held)} of {len(held)} checks")
    print(f"sample kernels passing kope judge: {sum(r['passes'] for r in judged)} of {len(judged)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps({"python": python if args.python else "fresh venv", "rows": rows}, indent=1)
    )
    return 0 if all(r["rejected"] for r in held) and all(r["passes"] for r in judged) else 1


if __name__ == "__main__":
    sys.exit(main())
