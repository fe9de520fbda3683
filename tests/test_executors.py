"""The executor seam's pieces that need no cluster: paths moved to a worker, what a worker may send
back, the node reservation, and the scheduler of concurrent operators."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_kope.judge.controller.executors import collect, moved, shipped_env
from pytest_kope.judge.controller.plan import NodeReservation, Ran
from pytest_kope.judge.controller.sandbox import Finished
from pytest_kope.scheduler import OneAtATime, each


def test_paths_move_only_under_their_prefix() -> None:
    moves = {"/tmp/kope-a": "/w/work", "/repo": "/node/repo"}
    spec = {
        "results": "/tmp/kope-a/results.jsonl",
        "other": "/tmp/kope-ab/x",  # a sibling with a longer name stays
        "files": ["/repo/t.py", "/repository/t.py"],
        "n": 3,
        "root": Path("/repo"),
    }
    assert moved(spec, moves) == {
        "results": "/w/work/results.jsonl",
        "other": "/tmp/kope-ab/x",
        "files": ["/node/repo/t.py", "/repository/t.py"],
        "n": 3,
        "root": Path("/node/repo"),
    }


def test_what_a_worker_sends_back_stays_in_the_work_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "replayed").mkdir(parents=True)
    (work / "results.jsonl").write_text("signed\n")
    (work / "replayed" / "0.npy").write_bytes(b"\x01")
    (work / "builds").mkdir()
    (work / "builds" / "k.so").write_bytes(b"lib")  # not sent back
    files = collect(work)
    assert sorted(files) == ["replayed/0.npy", "results.jsonl"]
    back = tmp_path / "back"
    back.mkdir()
    Ran(Finished(0, False, 1.0, ""), files, (0.0, 1.0)).unpack(back)
    assert (back / "replayed" / "0.npy").read_bytes() == b"\x01"
    with pytest.raises(ValueError, match="outside its work folder"):
        Ran(Finished(0, False, 1.0, ""), {"../escape": b"x"}, (0.0, 1.0)).unpack(back)
    assert not (tmp_path / "escape").exists()


def test_shipped_environment_is_the_judgement_settings_only() -> None:
    env = {"OMP_NUM_THREADS": "2", "PATH": "/bin", "ANTHROPIC_API_KEY": "k", "CC": "clang"}
    assert shipped_env(env) == {"OMP_NUM_THREADS": "2", "CC": "clang"}


def test_the_toolchain_environment_travels_less_the_nodes_own() -> None:
    """The toolchain's settings (its passed_env() and environment()) reach the worker in the plan; its
    toolkit paths and devices are the worker's own, never the controller's."""

    from pytest_kope.judge.controller.executors import for_worker, node_env
    from pytest_kope.judge.controller.plan import Plan
    from pytest_kope.operator import Operator

    toolchain_env = {
        "KOPE_C_SCREEN_BINARY": "0",
        "SOC_VERSION": "Ascend910B",
        "ASCEND_HOME_PATH": "/usr/local/Ascend",
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "OMP_WAIT_POLICY": "passive",
    }
    op = Operator(name="add", source=Path("add/add.cpp"), toolchain="ascendc", family="elementwise")
    plan = Plan(
        operator=op,
        rootdir=Path("."),
        inifile=None,
        files=[],
        correctness=[],
        performance=[],
        toolchain_env=toolchain_env,
        device_env_var="ASCEND_RT_VISIBLE_DEVICES",
    )
    plan = dataclasses.replace(plan, node=NodeReservation())
    assert for_worker(plan).toolchain_env == {
        "KOPE_C_SCREEN_BINARY": "0",
        "SOC_VERSION": "Ascend910B",
        "OMP_WAIT_POLICY": "passive",
    }
    assert for_worker(plan).node is None
    assert set(node_env(plan)) == {"ASCEND_HOME_PATH", "ASCEND_RT_VISIBLE_DEVICES"}


def test_a_timing_holds_the_node_whole() -> None:
    node = NodeReservation()
    inside: list[str] = []
    overlaps: list[list[str]] = []
    lock = threading.Lock()

    def hold(kind: str) -> None:
        with node.whole() if kind == "timing" else node.share():
            with lock:
                inside.append(kind)
                if "timing" in inside and len(inside) > 1:
                    overlaps.append(list(inside))
            time.sleep(0.02)
            with lock:
                inside.remove(kind)

    threads = [threading.Thread(target=hold, args=(k,)) for k in ["share", "timing"] * 8 + ["share"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlaps, overlaps[:3]


def test_each_runs_up_to_n_at_once_and_counts_what_is_left() -> None:
    running, most, lefts = [0], [0], []
    lock = threading.Lock()

    def work(item: int, left: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            lefts.append(left)
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    each(list(range(5)), work, 2)
    assert most[0] == 2
    assert sorted(lefts) == [1, 2, 3, 4, 5]
    order: list[tuple[int, int]] = []
    each([7, 8], lambda item, left: order.append((item, left)), 1)
    assert order == [(7, 2), (8, 1)]


def test_each_raises_the_first_error_and_starts_nothing_after_it() -> None:
    started: list[int] = []

    def work(item: int, left: int) -> None:
        started.append(item)
        if item == 0:
            raise RuntimeError("boom")
        time.sleep(0.05)

    with pytest.raises(RuntimeError, match="boom"):
        each(list(range(6)), work, 2)
    assert len(started) < 6


def test_one_at_a_time_serializes_method_calls() -> None:
    class Counter:
        tag = "plain attribute"

        def __init__(self) -> None:
            self.inside = 0
            self.overlap = False

        def bump(self) -> int:
            self.inside += 1
            self.overlap |= self.inside > 1
            time.sleep(0.001)
            self.inside -= 1
            return 1

    counter = Counter()
    shared = OneAtATime(counter)
    threads = [threading.Thread(target=lambda: [shared.bump() for _ in range(20)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not counter.overlap
    assert shared.tag == "plain attribute"


def test_operators_at_once_share_one_graph_and_see_each_others_attempts(tmp_path: Path) -> None:
    """Two operator threads write and read the controller's graph through OneAtATime: every attempt
    is recorded whole, and each thread sees the other's attempts as they land (what recall reads)."""
    from pytest_kope.candidate import Candidate
    from pytest_kope.judge.outcome import Judged, Outcome
    from pytest_kope.memory import Graph

    hw = {"arch": "x86_64", "model": "test", "simd": [], "cores": 2, "compiler": "gcc"}
    graph = Graph(tmp_path / ".kope" / "experience.db")
    shared = OneAtATime(graph)
    shared.start_run("r1", "tuner", hw)
    tasks = {op: shared.task_id(op, "rowwise", "c", hw) for op in ("rowsum", "softmax")}
    seen_other: dict[str, int] = {}
    errors: list[BaseException] = []

    def optimize(op: str, other: str) -> None:
        try:
            for i in range(25):
                c = Candidate(f"void {op}(){{}} // {i}", f"{op}.c", "c", {"I": i}, agent="tuner")
                shared.record(tasks[op], "r1", Judged(c, Outcome.OK))
                found = shared.rows("SELECT count(*) AS n FROM attempts WHERE task_id = ?", (tasks[other],))
                seen_other[op] = max(seen_other.get(op, 0), found[0]["n"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [
        threading.Thread(target=optimize, args=("rowsum", "softmax")),
        threading.Thread(target=optimize, args=("softmax", "rowsum")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[0]
        for op in tasks:
            assert (
                shared.rows("SELECT count(*) AS n FROM attempts WHERE task_id = ?", (tasks[op],))[0]["n"]
                == 25
            )
        assert max(seen_other.values()) > 0  # a thread saw the other's attempts while both ran
    finally:
        graph.close()


def test_a_node_without_the_jail_refuses_a_run_that_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised in the worker: Ray fails the task, the executor tries it elsewhere, then reports it."""
    from types import SimpleNamespace

    from pytest_kope.judge.controller import executors, sandbox

    monkeypatch.setattr(sandbox, "bubblewrap", lambda: (None, "bubblewrap not installed"))
    plan: Any = SimpleNamespace(jail_required=True)
    job = executors.Job(plan, {}, b"k", "/tmp/none", False, {}, (), False)
    with pytest.raises(RuntimeError, match="cannot jail this run's candidates: bubblewrap not installed"):
        executors.judge_on_this_node(job, None)
