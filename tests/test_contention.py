"""How busy the machine was while a timing ran (issue 36, item 9): measured from the kernel's CPU
counters, reported per operator, and a winner verified from a quiet timing, or with its interval
widened by the load. Real processes: a spinning neighbour is a real one."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest
from replay_run import ReplayRun

from pytest_kope.judge.measure.contention import CONTENDED, Load, Window


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _busy_for(seconds: float) -> float | None:
    with Window() as w:
        time.sleep(seconds)
    return w.others


def test_a_spinning_neighbour_is_contention() -> None:
    """Whatever else runs here, a neighbour spinning through the window adds one core's share."""
    ctx = multiprocessing.get_context("spawn")
    neighbour = ctx.Process(target=_spin, args=(3.0,))
    neighbour.start()
    try:
        time.sleep(0.5)
        loud = _busy_for(1.5)
    finally:
        neighbour.join()
    assert loud is not None and loud >= 0.8 / (os.cpu_count() or 1), loud


def test_own_cpu_time_is_not_contention() -> None:
    before = Load.now()
    start = time.process_time()
    while time.process_time() - start < 0.5:  # half a second of this process's CPU, however loaded
        pass
    after = Load.now()
    assert before is not None and after is not None
    assert after.own_s - before.own_s >= 0.45  # every thread of this process is counted as its own
    assert 0.0 <= after.others_since(before) <= 1.0
    # all of the machine's busy time was this process's: nothing of it is others'
    mine = Load(before.busy_s + 1.0, before.total_s + 2.0, before.own_s + 1.0)
    # (the counters are seconds since boot: a difference of two large floats is exact only to ~1e-12)
    assert mine.others_since(before) == pytest.approx(0.0, abs=1e-9)
    theirs = Load(before.busy_s + 1.5, before.total_s + 2.0, before.own_s + 0.5)
    assert theirs.others_since(before) == pytest.approx(0.5)


@pytest.fixture(scope="module")
def beside_a_neighbour(tmp_path_factory: pytest.TempPathFactory) -> ReplayRun:
    """The honest rowsum twin, judged while other processes hold every core but one."""
    ctx = multiprocessing.get_context("spawn")
    hogs = [
        ctx.Process(target=_spin, args=(600.0,), daemon=True)
        for _ in range(max(1, (os.cpu_count() or 2) - 1))
    ]
    for h in hogs:
        h.start()
    try:
        return ReplayRun(tmp_path_factory.mktemp("busy"), {"rowsum": ["plain_twin"]})
    finally:
        for h in hogs:
            h.terminate()


def test_the_report_says_how_busy_the_machine_was(beside_a_neighbour: ReplayRun) -> None:
    busy = beside_a_neighbour.ops["rowsum"]["machine_busy"]
    assert busy["max"] >= CONTENDED and busy["timings"] >= 2, busy
    md = next((beside_a_neighbour.repo / ".kope" / "runs").glob("*/report.md")).read_text()
    assert "How busy the machine was: others used" in md


def test_a_winner_timed_only_on_a_busy_machine_is_timed_again_and_its_interval_widened(
    beside_a_neighbour: ReplayRun,
) -> None:
    run = beside_a_neighbour
    entry = run.ops["rowsum"]
    # a 4x honest winner holds even with its low bound divided by the load; the run says it was timed
    # again, and on a busy machine
    assert entry["verified"], run.why("rowsum", "plain_twin")
    assert "timed again: others used" in run.output, run.output[-3000:]
    assert "timed on a busy machine (others used" in run.output, run.output[-3000:]
