"""The benches behind the README's figures: each runs at its smallest size and says what it measured.

Each smoke test runs one bench in a subprocess, as a user would, with its JSON sent to tmp_path, and
checks it exits 0, prints its table and writes its JSON. The figures' own procedures (a refined table
stores what it loads, the exact interval, the seeds' alternation, reaching by the median) are checked
on their own, on real tables and real runs.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import cold_warm, false_wins, shape_shift, tables, transfer_bound  # noqa: E402
from pytest_kope.agents.tuner.search import Table  # noqa: E402
from pytest_kope.spec import Scalar  # noqa: E402

HANG = 900  # a guard against a hung bench, not a speed requirement


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def a_table(points: list[dict[str, Any]]) -> dict[str, Any]:
    header = "// kope: kernel void f(const float *x, float *y, long n)\n// kope: param V = 1 | 2 | 4\n"
    return {"operator": "f", "family": "elementwise", "header": header, "hardware": {}, "points": points}


def test_refined_table_stores_the_ratio_it_loads(tmp_path: Path) -> None:
    """A refined point's ratio is the pooled one of the median of all its timings, and loading the
    table back gives the very figures stored, however lucky its first timing was."""
    table = a_table(
        [
            {
                "params": {"V": 1},
                "outcome": "ok",
                "ratio": 1.0,
                "seconds": 0.010,
                "ratios": [1.0],
                "times": [0.010],
            },
            {
                "params": {"V": 2},
                "outcome": "ok",
                "ratio": 1.9,
                "seconds": 0.0052,
                "ratios": [1.9],
                "times": [0.0052],
            },
            # refined: a lucky first timing (2 ms), then two ordinary ones
            {
                "params": {"V": 4},
                "outcome": "ok",
                "ratio": 5.0,
                "seconds": 0.002,
                "ratios": [5.0, 3.4, 3.3],
                "times": [0.002, 0.0030, 0.0031],
            },
        ]
    )
    path = tmp_path / "f.json"
    tables.save(path, table)
    stored = json.loads(path.read_text())
    refined = stored["points"][2]
    assert refined["seconds"] == statistics.median([0.002, 0.0030, 0.0031])
    committed = statistics.median(r["measured_ratio"] * r["seconds"] for r in stored["points"])
    assert math.isclose(refined["ratio"], committed / 0.0030)
    assert refined["ratio"] < 4.0  # not the lucky timing's 5x
    loaded = Table.from_json(stored)
    for row in stored["points"]:
        assert math.isclose(loaded.speedup(row["params"]) or 0.0, row["ratio"], rel_tol=1e-12)
    again = Table.from_json(json.loads(path.read_text()))
    assert again.best() == loaded.best() == refined["ratio"]


def test_a_table_saved_twice_is_unchanged(tmp_path: Path) -> None:
    rows = [
        {"params": {"V": v}, "outcome": "ok", "ratio": r, "seconds": s, "ratios": [r], "times": [s]}
        for v, r, s in ((1, 1.0, 0.01), (2, 2.2, 0.0045), (4, 3.1, 0.0033))
    ]
    path = tmp_path / "f.json"
    tables.save(path, a_table(rows))
    first = path.read_text()
    tables.save(path, json.loads(first))
    assert path.read_text() == first


def test_clopper_pearson_is_exact() -> None:
    assert false_wins.clopper_pearson(0, 200)[0] == 0.0
    assert math.isclose(false_wins.clopper_pearson(0, 200)[1], 1 - 0.025 ** (1 / 200), rel_tol=1e-9)
    assert math.isclose(false_wins.clopper_pearson(30, 30)[0], 0.025 ** (1 / 30), rel_tol=1e-9)
    low, high = false_wins.clopper_pearson(3, 56)
    mirror = false_wins.clopper_pearson(53, 56)
    assert math.isclose(low, 1 - mirror[1], rel_tol=1e-9) and math.isclose(high, 1 - mirror[0], rel_tol=1e-9)
    # at the bounds the binomial tails are 2.5% each
    assert math.isclose(false_wins.binomial_cdf(3, 56, high), 0.025, rel_tol=1e-6)
    assert math.isclose(1 - false_wins.binomial_cdf(2, 56, low), 0.025, rel_tol=1e-6)


def test_false_win_summary_names_its_pairs() -> None:
    pairs = [{"operator": f"op{i % 3}", "false_win": i == 5, "second_look": i % 2 == 0} for i in range(60)]
    s = false_wins.summary(pairs)
    assert (s["pairs"], s["false_wins"]) == (60, 1)
    text = false_wins.line(s)
    assert "1 false wins in 60 independent pairs" in text and "exact 95% interval 0.0%-8.9%" in text
    assert "verification" not in text  # none was asked for
    for i, p in enumerate(pairs[:10]):  # with --aa-verify: how many twins a winner's verification passed
        p["verified"] = i == 3
    assert "1 of 10 twins passed a winner's verification" in false_wins.line(false_wins.summary(pairs))


def test_each_arm_goes_first_on_half_of_the_seeds() -> None:
    for index in range(3):
        firsts = [cold_warm.arm_order(seed, index)[0] for seed in range(1, 5)]
        assert sorted(firsts) == ["cold", "cold", "warm", "warm"]
    assert cold_warm.arm_order(1, 0)[0] != cold_warm.arm_order(1, 1)[0]


def test_reaching_colds_level_is_decided_by_the_median_ratio() -> None:
    # an interval whose upper end is above 1 says the test could not tell, not that warm is as good
    assert not cold_warm.level({"ratio": 0.80, "low": 0.6, "high": 1.1})
    assert cold_warm.level({"ratio": 0.96, "low": 0.9, "high": 1.0})
    results = [
        {
            "operator": "rowsum",
            "head_to_head": {"ratio": r},
            "warm_over_cold": None,
            "warm_evals_to_cold_level": None,
            "warm_worse": r == 0.80,
        }
        for r in (0.90, 0.93, 1.2, 0.80)
    ]
    (summary,) = cold_warm.per_operator(results)
    assert summary["head_to_head_median"] == statistics.median([0.90, 0.93, 1.2, 0.80])
    assert not summary["warm_level"] and summary["head_to_head_range"] == [0.80, 1.2]
    assert summary["warm_worse_beyond_noise"] == 1


def test_a_warm_run_that_never_reaches_colds_level_counts_as_budget_plus_one() -> None:
    """The seeds where warm does worst stay in the median: left out, they made 1.10 read 0.17."""
    assert shape_shift.over_cold(None, 10, budget=24) == 2.5
    assert shape_shift.over_cold(5, 10, budget=24) == 0.5
    assert shape_shift.over_cold(0, 10, budget=24) == 0.0  # a held point already at cold's level
    assert shape_shift.over_cold(5, None, budget=24) is None  # cold has no level to reach
    runs = [
        {
            "cold": 30.0,
            "warm": 30.0,
            "cold_to_level": 10,
            "warm_to_level": w,
            "cold_evaluations": 24,
            "warm_evaluations": 24,
        }
        for w in (1, 2, None, None, None)
    ]
    summary = shape_shift.summary("a -> b", runs)
    assert summary["warm_never_at_cold_level"] == 3
    assert summary["warm_over_cold_evaluations"] == (shape_shift.BUDGET + 1) / 10


def test_tables_smoke_refines_and_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "tables"
    proc = bench(
        "bench/tables.py",
        "--ops",
        "rowsum",
        "--max-points",
        "2",
        "--refine",
        "1",
        "--again",
        "1",
        "--out",
        str(out),
    )
    assert "rowsum" in proc.stdout and "points, best" in proc.stdout
    stored = json.loads((out / "rowsum.json").read_text())
    refined = [p for p in stored["points"] if len(p.get("times", [])) == 2]
    assert len(refined) == 1, stored["points"]
    assert refined[0]["seconds"] == statistics.median(refined[0]["times"])
    loaded = Table.from_json(stored)
    for row in stored["points"]:
        if row.get("ratio"):
            assert math.isclose(loaded.speedup(row["params"]) or 0.0, row["ratio"], rel_tol=1e-12)


def test_search_smoke_reports_pipelines_apart(tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    proc = bench("bench/search.py", "--ops", "softmax,swiglu", "--seeds", "1", "--json", str(out))
    measured, _, composed = proc.stdout.partition("composed pipelines (synthetic)")
    assert "median over operators" in measured and "softmax+swiglu" not in measured
    assert "median over pipelines" in composed and "softmax+swiglu" in composed
    data = json.loads(out.read_text())
    assert data["composed"] == ["softmax+swiglu"] and set(data["results"]) >= {"softmax", "swiglu"}


def test_shape_shift_smoke(tmp_path: Path) -> None:
    out = tmp_path / "shape_shift.json"
    proc = bench("bench/shape_shift.py", "--seeds", "2", "--out", str(out))
    assert "bmm -> bmm_wide" in proc.stdout and "a cold seed worse than another" in proc.stdout
    data = json.loads(out.read_text())
    assert [r["direction"] for r in data["results"]] == ["bmm -> bmm_wide", "bmm_wide -> bmm"]
    assert all(len(r["runs"]) == 2 and r["seeds"] == 2 for r in data["results"])


def test_transfer_bound_smoke(tmp_path: Path) -> None:
    out = tmp_path / "transfer_bound.json"
    proc = bench("bench/transfer_bound.py", "--seeds", "2", "--out", str(out))
    assert "stencil2d: shared axes VEC, NT, THREADS, flags" in proc.stdout
    assert "one cold seed worse than another" in proc.stdout
    (result,) = json.loads(out.read_text())["results"]
    assert [s["search"] for s in result["searches"]] == transfer_bound.SEARCHES
    assert all(run["cold"]["to_cold_level"] for run in result["runs"])  # cold reaches its own level


def test_a_held_search_sees_the_smaller_space_at_the_tables_own_figures() -> None:
    target = shape_shift.load("stencil2d", transfer_bound.TABLES / "large_ops")
    values: dict[str, Scalar] = {"VEC": 8, "NT": 1, "THREADS": 2, "flags": "-O3 -march=native"}
    info, table, base = transfer_bound.held(target, values)
    assert len(table.rows) == len(list(info.space.points())) > 1
    assert table.speedup(info.space.defaults) == pytest.approx(1.0)
    assert base == target.speedup(info.space.defaults)
    for point in table.points():
        assert all(point[k] == v for k, v in values.items())
        assert (table.speedup(point) or 0.0) * base == pytest.approx(target.speedup(point))


def test_fill_and_target_tables_must_come_from_one_machine() -> None:
    target = shape_shift.load("stencil2d", transfer_bound.TABLES / "large_ops")
    here = shape_shift.load("softmax", transfer_bound.TABLES / "epyc_avx2")
    transfer_bound.one_machine(target, [here])
    elsewhere = shape_shift.load("softmax", transfer_bound.TABLES)  # the Xeon's sample tables
    with pytest.raises(SystemExit, match="measure both on one machine"):
        transfer_bound.one_machine(target, [here, elsewhere])


def test_overhead_smoke_gives_the_false_win_rate_with_its_interval(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    proc = bench(
        "bench/overhead.py",
        "--ops",
        "rowsum",
        "--modes",
        "after",
        "--attempts",
        "1",
        "--aa",
        "1",
        "--json",
        str(out),
    )
    assert "per attempt, median seconds" in proc.stdout
    assert "independent pairs" in proc.stdout and "exact 95% interval" in proc.stdout
    assert "A/A: 1 of 1 pairs, " in proc.stdout  # progress as it goes: 200 pairs take over an hour
    data = json.loads(out.read_text())
    assert data["aa_summary"]["pairs"] == 1 and len(data["results"]["after"]) == 1


def test_cold_warm_smoke(tmp_path: Path) -> None:
    out = tmp_path / "cold_warm.json"
    proc = bench(
        "bench/cold_warm.py",
        "--budget",
        "1",
        "--fill-budget",
        "1",
        "--seeds",
        "1",
        "--fill",
        "gelu",
        "--eval",
        "rowsum",
        "--out",
        str(out),
    )
    assert "1 seeds" in proc.stdout and "warm vs cold winner, head to head" in proc.stdout
    data = json.loads(out.read_text())
    assert data["seeds"] == [1] and [s["operator"] for s in data["summary"]] == ["rowsum"]
    assert data["results"][0]["first"] in ("cold", "warm")
    assert data["results"][0]["cold_evaluations"] == 1 and "warm_untried_axes" in data["results"][0]


def test_check_spaces_smoke(tmp_path: Path) -> None:
    out = tmp_path / "check_spaces.json"
    proc = bench(
        "bench/check_spaces.py",
        "--repo",
        "sample_ops",
        "--ops",
        "rowsum",
        "--target",
        "",
        "--max-points",
        "2",
        "--json",
        str(out),
    )
    assert "2 points checked, 2 passed, 0 failed" in proc.stdout
    assert json.loads(out.read_text())["checked"][0]["points"] == 2


def test_kill_loop_smoke(tmp_path: Path) -> None:
    out = tmp_path / "kill_loop.json"
    proc = bench(
        "bench/kill_loop.py",
        "--iterations",
        "1",
        "--budget",
        "1",
        "--min-kill",
        "1",
        "--max-kill",
        "1",
        "--seed",
        "1",
        "--out",
        str(out),
    )
    assert "kill loop: PASS" in proc.stdout and "integrity" in proc.stdout
    assert json.loads(out.read_text())["ok"] is True


def test_candidate_path_follows_the_winner_from_the_loop_to_the_report(tmp_path: Path) -> None:
    out = tmp_path / "candidate_path.json"
    proc = bench("bench/candidate_path.py", "--budget", "1", "--json", str(out))
    way = json.loads(out.read_text())
    assert "files" in proc.stdout and way["candidate"], proc.stdout[-2000:]
    first, *_, last = way["way"]
    assert first.startswith("pytest_kope/session/loop.py") and last.startswith("pytest_kope/review/"), way[
        "way"
    ]
    assert any(stay.startswith("pytest_kope/judge/controller/") for stay in way["way"])
    assert way["files"] == len(way["entered"]) and way["stays"] == len(way["way"]) == sum(
        way["entered"].values()
    )


def test_local_model_smoke(tmp_path: Path) -> None:
    """Against a real llama.cpp server where one and the model are installed; else one line says so."""
    out = tmp_path / "local_model.json"
    proc = bench("bench/local_model.py", "--minutes", "1", "--no-extra", "--json", str(out))
    data = json.loads(out.read_text())
    if "skipped" in data:
        assert proc.stdout.strip() == f"local_model: skipped: {data['skipped']}"
        return
    assert "main run: exit" in proc.stdout and "prompt_tokens" in proc.stdout, proc.stdout[-3000:]
    assert data["main"]["calls"] and data["main"]["records"] > len(data["main"]["calls"])  # and the prompts


def test_peers_smoke(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "peers.json"
    proc = bench("bench/peers.py", "--ops", "rowsum", "--rounds", "3", "--no-compile", "--out", str(out))
    assert "committed" in proc.stdout and "torch" in proc.stdout
    assert [op["operator"] for op in json.loads(out.read_text())["operators"]] == ["rowsum"]


def test_ray_overhead_smoke(tmp_path: Path) -> None:
    pytest.importorskip(
        "ray", reason="bench/ray_overhead.py starts a local Ray cluster: pip install 'pytest-kope[ray]'"
    )
    out = tmp_path / "ray_overhead.json"
    proc = bench("bench/ray_overhead.py", "--judgements", "1", "--no-runs", "--json", str(out))
    assert "ray" in proc.stdout.lower()
    assert json.loads(out.read_text())["per_judgement"]


def test_forwarding_smoke(tmp_path: Path) -> None:
    out = tmp_path / "forwarding.json"
    proc = bench("bench/forwarding.py", "--ops", "rowsum", "--calls", "5", "--json", str(out))
    assert "forwarded us" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["operator"] for r in rows] == ["rowsum", "rowsum"] and all(r["forwarded us"] > 0 for r in rows)


def cuda_device() -> str | None:
    """Why the GPU check cannot run here, or None when it can."""
    if shutil.which("nvidia-smi") is None:
        return "bench/gpu_check.sh needs an NVIDIA GPU (no nvidia-smi here)"
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        return f"bench/gpu_check.sh needs torch and triton: {e}"
    return None if torch.cuda.is_available() else "bench/gpu_check.sh needs a CUDA device torch can see"


def test_gpu_check_smoke(tmp_path: Path) -> None:
    if (why := cuda_device()) is not None:
        pytest.skip(why)
    env = {**os.environ, "KOPE_GPU_BUDGET": "1", "KOPE_GPU_OUT": str(tmp_path)}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tests exit 0, optimize exit 0" in proc.stdout
    assert json.loads((tmp_path / "gpu_check.json").read_text())["operators"]


def test_ownbuild_flags_smoke(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    out = tmp_path / "ownbuild_flags.json"
    proc = bench(
        "bench/ownbuild_flags.py", "--ops", "poly", "--budget", "2", "--rounds", "3", "--json", str(out)
    )
    assert "make on kope/ branch" in proc.stdout and "own make / pytest-kope build" in proc.stdout
    (row,) = json.loads(out.read_text())["operators"]
    assert row["operator"] == "poly" and "main" in row["delivered"]
    if row["own"]["verified"]:  # a busy machine may leave none: then there is no branch to build
        assert row["fallback"]["dispatches"] is False and row["fallback"]["same results as main"] is True


def test_ascend_install_smoke(tmp_path: Path) -> None:
    from pytest_kope.toolchains import devices

    if devices.triton_flavour() != "ascend":
        pytest.skip(
            "bench/ascend_install.py needs triton-ascend here; it makes its own venv: python bench/ascend_install.py"
        )
    out = tmp_path / "ascend_install.json"
    proc = bench(
        "bench/ascend_install.py",
        "--python",
        sys.executable,
        "--ops",
        "gelu",
        "--held-out",
        "where_heuristics",
        "--json",
        str(out),
    )
    assert "held-out kernels rejected: 3 of 3 checks" in proc.stdout
    assert "sample kernels passing kope judge: 1 of 1" in proc.stdout
    rows = {r["step"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["pytest --kope-toolchain triton-ascend"]["result"].startswith("4 passed, 1 skipped")
    assert "1 ready to optimize" in rows["pytest --kope-check --kope-toolchain triton-ascend"]["result"]
