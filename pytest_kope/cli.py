"""`kope`: read and move the experience graph from the shell.

    kope graph stats                 counts per table, per outcome, per agent; measured ceilings
    kope graph show OPERATOR         each task's attempts as a tree by parent links
    kope graph check                 is the file sound? (exit 1 when damaged, with how to recover it)
    kope lessons [--operator X] [--limit N]
    kope export FILE.jsonl           the whole graph as JSON Lines (and the WAL folded into the file)
    kope import FILE.jsonl           merge an export (importing twice adds nothing)
    kope judge OP FILE [pytest args] judge one candidate file as a run would (judgefile.py)
    kope context OP [--agent A]      the prompt the LLM agent would send for OP now, and why (contextfile.py)
    kope doctor [pytest args]        check a repo's operators without optimizing

`--db PATH` (before or after the command) names the graph; default ./.kope/experience.db.
Errors print one line naming the file and what to do, and exit with status 2 (a damaged graph too:
only `kope graph check` reads it, to say what is wrong).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from .errors import KopeError
from .memory import export_jsonl, import_jsonl

if TYPE_CHECKING:
    from .memory import Graph

DEFAULT_DB = Path(".kope") / "experience.db"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", type=Path, default=argparse.SUPPRESS, help=f"experience graph (default ./{DEFAULT_DB})"
    )
    parser = argparse.ArgumentParser(
        prog="kope", description="Inspect and exchange pytest-kope's experience graph.", parents=[common]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    graph = sub.add_parser("graph", help="the graph: stats, or one operator's trajectory", parents=[common])
    graph_sub = graph.add_subparsers(dest="graph_command", required=True, metavar="stats|show|check")
    graph_sub.add_parser("stats", help="counts per table, outcome and agent", parents=[common])
    show = graph_sub.add_parser(
        "show", help="an operator's attempts as a tree by parent links", parents=[common]
    )
    show.add_argument("operator")
    graph_sub.add_parser(
        "check",
        help="check the file's integrity; exit 1 when damaged, with how to recover it",
        parents=[common],
    )
    lessons = sub.add_parser("lessons", help="lessons learned, most valuable first", parents=[common])
    lessons.add_argument("--operator", help="only lessons about this operator")
    lessons.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    export = sub.add_parser("export", help="write the graph as JSON Lines", parents=[common])
    export.add_argument("file", type=Path)
    imp = sub.add_parser("import", help="merge a JSON Lines export into the graph", parents=[common])
    imp.add_argument("file", type=Path)
    doctor = sub.add_parser(
        "doctor", help="check a repo's operators without optimizing (runs pytest --kope-check)"
    )
    doctor.add_argument(
        "pytest_args", nargs=argparse.REMAINDER, help="paths and pytest options, e.g. sample_ops -k softmax"
    )
    judge = sub.add_parser("judge", help="judge one candidate file exactly as an optimize run would")
    judge.add_argument("operator", help="the operator (the `kope` marker's name)")
    judge.add_argument("file", help="the candidate's kernel source")
    judge.add_argument("pytest_args", nargs=argparse.REMAINDER, help="paths and pytest options")
    context = sub.add_parser(
        "context", help="the prompt the LLM agent would send for an operator now, and why each piece is in it"
    )
    context.add_argument("operator", help="the operator (the `kope` marker's name)")
    context.add_argument(
        "rest", nargs=argparse.REMAINDER, help="--agent claude|openai:MODEL, --repo DIR, pytest args"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `kope` command: its subcommands read the experience graph."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"] and not {"-h", "--help"} & set(argv[1:2]):
        # a pytest run: collection finds the operators, the judge checks them; the rest goes to pytest
        import subprocess

        return subprocess.call([sys.executable, "-m", "pytest", "--kope-check", *argv[1:]])
    if argv[:1] == ["judge"] and not {"-h", "--help"} & set(argv[1:2]):
        from .judgefile import main as judge_file

        return judge_file(argv[1:])
    if argv[:1] == ["context"]:
        from .contextfile import main as context

        return context(argv[1:])
    args = _parser().parse_args(argv)
    db_path: Path = getattr(args, "db", DEFAULT_DB)
    try:
        return _run(args, db_path)
    except KopeError as e:
        print(f"kope: {e}", file=sys.stderr)
        return 2
    except sqlite3.DatabaseError as e:
        print(
            f"kope: {db_path} is not a usable experience graph ({e}); pass the right file with --db",
            file=sys.stderr,
        )
        return 2


def _open(db_path: Path, create: bool = False) -> Any:
    from .memory import Graph
    from .memory.opening import damage

    if not create and not db_path.is_file():
        raise KopeError(
            f"no experience graph at {db_path}; run `pytest --kope-optimize` first, or pass --db PATH"
        )
    if found := damage(db_path):  # what a damaged file answers would be silently incomplete
        raise KopeError(_damaged(db_path, found))
    return Graph(db_path)


def _damaged(db_path: Path, found: str) -> str:
    from .memory.opening import recovery

    return (
        f"{db_path} is damaged ({found}); the next `pytest --kope-optimize` moves it aside and starts"
        f" a fresh graph; to keep what it holds: {recovery(db_path, None)}, then `kope import` that file"
    )


def _check(db_path: Path) -> int:
    """`kope graph check`: the whole file's integrity, in one line; 0 when sound, 1 when damaged."""
    from .memory.opening import damage

    if not db_path.is_file():
        raise KopeError(f"no experience graph at {db_path}; pass --db PATH")
    found = damage(db_path, thorough=True)
    print(f"kope: {_damaged(db_path, found)}" if found else f"kope: {db_path} is sound (integrity_check: ok)")
    return 1 if found else 0


def _run(args: argparse.Namespace, db_path: Path) -> int:
    if args.command == "import":
        if not args.file.is_file():
            raise KopeError(f"cannot read {args.file}: no such file; pass a file written by `kope export`")
        with _open(db_path, create=True) as graph:
            added = import_jsonl(graph, args.file)
        summary = ", ".join(f"{n} {k}" for k, n in sorted(added.items())) or "nothing new"
        print(f"imported {args.file} into {db_path}: {summary}")
        return 0
    if args.command == "graph" and args.graph_command == "check":
        return _check(db_path)
    with _open(db_path) as graph:
        if args.command == "export":
            graph.checkpoint()  # CI saves experience.db to its cache next: fold the write-ahead log in
            n = export_jsonl(graph, args.file)
            print(f"exported {n} records from {db_path} to {args.file}")
        elif args.command == "lessons":
            _lessons(graph, args.operator, args.limit)
        elif args.graph_command == "stats":
            _stats(graph)
        else:
            return _show(graph, args.operator)
    return 0


def _stats(graph: Graph) -> None:
    stats = graph.stats()
    print(f"experience graph {stats['path']}")
    print(tabulate(sorted(stats["tables"].items()), headers=["table", "rows"]))
    for title in ("outcomes", "agents", "operators"):
        if stats[title]:
            print()
            print(tabulate(list(stats[title].items()), headers=[title[:-1], "attempts"]))
    for c in stats["ceilings"]:
        data = c["data"]
        print()
        print(
            f"ceilings on {c['hardware']} (measured {c['measured_at'][:19]}, {data.get('threads', '?')} threads):"
            f" FMA peak {data['gflops']:.0f} GFLOP/s"
        )
        rows = [
            (_bytes(size), f"{r:.1f}", f"{w:.1f}", f"{cp:.1f}")
            for size, r, w, cp in zip(data["sizes"], data["read"], data["write"], data["copy"])
        ]
        print(
            tabulate(
                rows, headers=["working set", "read GB/s", "write GB/s", "copy GB/s"], disable_numparse=True
            )
        )


def _bytes(n: int) -> str:
    units = ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B"))
    return next(f"{n / (1 << s):.4g} {u}" for s, u in units if n >> s or not s)


def _fmt(x: float | None, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


def _show(graph: Graph, operator: str) -> int:
    tasks = graph.tasks(operator)
    if not tasks:
        known = sorted({t["operator"] for t in graph.tasks()})
        hint = f"known operators: {', '.join(known)}" if known else "the graph has no operators yet"
        raise KopeError(f"no attempts for operator {operator!r} in {graph.path}; {hint}")
    for task in tasks:
        attempts = graph.attempts(task["id"])
        best = graph.best(task["id"])
        committed = _committed(graph, task["id"])
        print(
            f"{task['operator']} [{task['toolchain']}] on {task['hardware'] or task['hardware_id']}:"
            f" {len(attempts)} attempts (* committed to its kope/ branch, + fastest measured when not the same)"
        )
        by_hash = {a["candidate_hash"]: a for a in attempts}
        children: dict[str | None, list[dict[str, Any]]] = {}
        for a in attempts:
            parent = a["parent_hash"] if a["parent_hash"] in by_hash else None
            children.setdefault(parent, []).append(a)
        stack = [(a, 1) for a in reversed(children.get(None, []))]
        while stack:  # iterative depth-first walk: long lineages must not hit the recursion limit
            a, depth = stack.pop()
            h = a["candidate_hash"]
            mark = "*" if committed == h else "+" if best and best["candidate_hash"] == h else " "
            print(
                f"{'  ' * depth}{mark}{a['candidate_hash'][:8]} {a['agent'] or '?'} {a['outcome']}"
                f" ratio {_fmt(a['ratio'])} speedup {_fmt(a['speedup'], 'x')}"
                + (f"  {a['idea']}" if a["idea"] else "")
            )
            stack.extend((c, depth + 1) for c in reversed(children.get(a["candidate_hash"], [])))
    return 0


def _committed(graph: Graph, task_id: int) -> str | None:
    """The candidate hash last committed for the task (`Graph.mark_committed`), if any."""
    found = graph.last_committed(task_id)
    return found["candidate_hash"] if found else None


def _lessons(graph: Graph, operator: str | None, limit: int) -> None:
    rows = graph.lessons(operator=operator, limit=limit)
    if not rows:
        print("no lessons yet" + (f" about {operator}" if operator else ""))
        return
    table = [
        (f"{r['value']:.2f}", r["uses"], r["wins"], r["fails"], _fmt(r["effect"], "x"), r["text"])
        for r in rows
    ]
    print(tabulate(table, headers=["value", "uses", "wins", "fails", "effect", "lesson"]))


if __name__ == "__main__":
    sys.exit(main())
