"""pytest_kope/peers (bench/peers.py and --kope-peers): real gcc, real torch and numpy, real jail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kope.peers import (
    CASES,
    Comparison,
    Setup,
    Timed,
    child,
    compare,
    headline,
    import_torch,
    table,
    use_threads,
)
from pytest_kope.review import prbody, report_md
from pytest_kope.spec import Point, bake_defaults

ROOT = Path(__file__).resolve().parent.parent
ROWSUM = ROOT / "sample_ops" / "rowsum" / "rowsum.c"
FAST_ROWSUM: Point = {"VEC": 16, "ACC": 1, "ROWS": 1, "THREADS": 2, "flags": "-O3 -march=native"}
torch = import_torch()
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def test_every_case_matches_its_sample_operator() -> None:
    from pytest_kope.spec import parse_spec

    for name, case in CASES.items():
        source = ROOT / "sample_ops" / name / f"{name}.c"
        assert case.matches(tuple(parse_spec(source.read_text()).kernels)), name
    assert not CASES["rowsum"].matches(("void rowsum(const double *x, double *y, int rows, int cols)",))


class SpinnerClock:
    """A process whose other threads burn a whole CPU until `spins_until` (wall seconds), then rest:
    the clock `_quiet` reads, free of the machine's load."""

    def __init__(self, spins_until: float) -> None:
        self.wall = self.cpu = 0.0
        self.spins_until = spins_until

    def perf_counter(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu

    def sleep(self, seconds: float) -> None:
        self.cpu += max(0.0, min(self.wall + seconds, self.spins_until) - self.wall)
        self.wall += seconds


def test_each_block_waits_for_the_threads_of_the_last_one_to_stop_spinning() -> None:
    """A pool thread that spins after its call (OpenBLAS: ~0.1 s) would share the cores with the next
    contender's whole block; `_quiet` waits it out, and costs one short probe on a quiet process."""
    from pytest_kope.peers.measure import QUIET_MAX_S, _quiet

    assert _quiet(0.005, SpinnerClock(0.0)) == 0.005  # quiet: one probe
    waited = _quiet(0.005, SpinnerClock(0.15))
    assert 0.15 <= waited <= 0.15 + 0.005 * 2  # until the spinner stopped, a probe or two after
    assert _quiet(0.005, SpinnerClock(float("inf"))) >= QUIET_MAX_S  # a spinner that never stops
    assert _quiet() >= 0.005  # the real clock: at least one probe


@needs_torch
def test_compare_times_kernels_next_to_peers_and_the_measured_roof(tmp_path: Path) -> None:
    text = ROWSUM.read_text()
    kernels = [
        ("committed", text, ROWSUM.name, ROWSUM.parent),
        ("fast", bake_defaults(text, FAST_ROWSUM), ROWSUM.name, ROWSUM.parent),
    ]
    set_by = use_threads(2, torch)
    assert "torch.set_num_threads(2)" in set_by
    result = compare(
        CASES["rowsum"], kernels, tmp_path, Setup(threads=2, rounds=5, compiled=False), torch=torch
    )
    labels = [t.label for t in result.timed]
    assert labels == ["committed", "fast", "numpy", "torch eager"]
    assert result.best_peer in ("numpy", "torch eager") and result.roof == "read" and result.roof_value > 0
    for t in result.timed:
        assert t.correct and t.low_s <= t.median_s <= t.high_s and t.roof_fraction > 0, t
        low, mid, high = t.vs_best_peer_low, t.vs_best_peer, t.vs_best_peer_high
        assert low is not None and mid is not None and high is not None and low <= mid <= high, t
    fast, committed = result.get("fast"), result.get("committed")
    assert fast is not None and committed is not None, labels
    assert fast.params == FAST_ROWSUM and fast.median_s < committed.median_s  # 16 lanes vs one serial chain
    best_peer = result.get(result.best_peer)
    assert best_peer is not None and best_peer.vs_best_peer == 1.0
    assert Comparison.from_json(json.loads(json.dumps(result.to_json()))) == result
    assert "rowsum" in table([result]) and "(best peer)" in table([result])


def test_the_avx2_isa_builds_kernels_and_the_roof_without_avx512_code(tmp_path: Path) -> None:
    """--isa avx2 adds -mno-avx512f after a point's -march=native: objdump finds no zmm or mask register
    in the winner or the roof probe (and does find them in the native build on an AVX-512 machine)."""
    from pytest_kope.peers import isa, measure, wide_code
    from pytest_kope.spec import FLAGS

    avx2 = isa("avx2")
    assert avx2.cflags == ("-mno-avx512f",) and avx2.env["ATEN_CPU_CAPABILITY"] == "avx2"
    point = {**FAST_ROWSUM, "ACC": 2}  # the vector-extension path, one row per sweep
    text = bake_defaults(ROWSUM.read_text(), point)
    kernel, params = measure.build(text, ROWSUM.name, ROWSUM.parent, tmp_path, avx2)
    assert params[FLAGS] == "-O3 -march=native"  # the point's own flags are what is reported
    assert wide_code(kernel.extra["library"], avx2) == []
    roof, _ = measure.build(measure.ROOF_C.read_text(), "roof.c", measure.ROOF_C.parent, tmp_path, avx2)
    assert wide_code(roof.extra["library"], avx2) == []
    native, _ = measure.build(text, ROWSUM.name, ROWSUM.parent, tmp_path)
    if "avx512f" in Path("/proc/cpuinfo").read_text():
        assert any("zmm" in line for line in wide_code(native.extra["library"], avx2))


def test_the_isa_settings_never_override_the_users_environment() -> None:
    from pytest_kope.peers import isa, missing_env

    avx2 = isa("avx2")
    assert missing_env(avx2, {"ATEN_CPU_CAPABILITY": "avx2"}) == {
        k: v for k, v in avx2.env.items() if k != "ATEN_CPU_CAPABILITY"
    }
    with pytest.raises(ValueError, match="ATEN_CPU_CAPABILITY='default'"):
        missing_env(avx2, {"ATEN_CPU_CAPABILITY": "default"})
    assert missing_env(isa("native"), {}) == {}
    with pytest.raises(ValueError, match="unknown ISA"):
        isa("avx512")


def test_a_kernel_with_a_wrong_output_is_timed_but_flagged(tmp_path: Path) -> None:
    text = ROWSUM.read_text().replace("y[r] = s0;", "y[r] = s0 * 1.01f;")
    kernels = [
        ("committed", ROWSUM.read_text(), ROWSUM.name, ROWSUM.parent),
        ("wrong", text, ROWSUM.name, ROWSUM.parent),
    ]
    result = compare(CASES["rowsum"], kernels, tmp_path, Setup(threads=1, rounds=3), torch=None)
    wrong = result.get("wrong")
    assert wrong is not None and not wrong.correct and wrong.error > 1e-3
    assert "WRONG OUTPUT" in table([result])
    assert "differs from the reference" in headline(result, "wrong")


def _result(ratio: float, low: float, high: float) -> Comparison:
    def timed(label: str, kind: str, r: float, lo: float, hi: float) -> Timed:
        return Timed(label, kind, 0.01, 0.009, 0.011, True, 0.0, 0.8, r, lo, hi)

    return Comparison(
        "softmax", 2, 9, "copy", 20.0, 1 << 27, 0.0,
        (timed("winner", "kernel", ratio, low, high), timed("torch.compile", "peer", 1.0, 1.0, 1.0)),
        "torch.compile", 12.0, 30.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "ratio,low,high,said",
    [
        (1.4, 1.2, 1.6, "softmax: now 1.40x faster than torch.compile on this machine"),
        (0.5, 0.4, 0.6, "softmax: now 2.00x slower than torch.compile on this machine"),
        (1.02, 0.9, 1.1, "softmax: now as fast as (1.02x) torch.compile on this machine"),
    ],
)
def test_the_headline_says_faster_only_when_the_whole_interval_says_so(ratio, low, high, said) -> None:
    line = headline(_result(ratio, low, high), "winner")
    assert line.startswith(said) and "2 threads" in line and "0.80 of the measured copy roof" in line


def test_report_md_and_the_pr_body_carry_the_peer_headline() -> None:
    line = headline(_result(1.4, 1.2, 1.6), "winner")
    operator = {
        "name": "softmax", "family": "rowwise", "toolchain": "c", "source": "softmax/softmax.c",
        "baseline_s": 0.1, "best_s": 0.02, "speedup": 5.0, "evaluations": 4, "evaluations_to_best": 3,
        "branch": "kope/softmax", "commit": "abc", "verified": True, "note": "", "seconds": 10.0,
        "outcomes": {"ok": 4}, "candidates": [], "best": {"id": "x", "idea": "vector exp", "params": {}},
        "peers": {"headline": line, "best_peer": "torch.compile", "ratio": 1.4},
    }  # fmt: skip
    data = {"run_id": "r1", "agent": "tuner", "budget": 4, "operators": [operator], "seconds": 12.0}
    md = report_md.markdown(data)
    assert "Next to the kernel-only peers" in md and f"- {line}" in md
    assert f"- Next to the peers: {line}" in md
    failed = {**operator, "peers": {"error": "the peer comparison exited 1: boom"}}
    assert "softmax: no peer comparison (the peer comparison exited 1: boom)" in report_md.markdown(
        {**data, "operators": [failed]}
    )
    assert prbody.Evidence.__dataclass_fields__["peers"].default == ""


@needs_torch
def test_the_child_measures_a_winner_in_the_jail(tmp_path: Path) -> None:
    """What --kope-peers runs after a verification: the committed kernel and the winner with every
    peer, torch.compile included, in a jailed child; the controller reads only its JSON."""
    assert child.applies("rowsum", ROWSUM.read_text())
    assert not child.applies("scale", ROWSUM.read_text())
    data = child.measure(
        "rowsum", ROWSUM, bake_defaults(ROWSUM.read_text(), FAST_ROWSUM), ROWSUM.parent, rounds=3
    )
    assert "error" not in data, data
    assert data["versions"]["torch"] == torch.__version__
    data.pop("versions")
    result = Comparison.from_json(data)
    assert [t.label for t in result.timed] == ["committed", "winner", "numpy", "torch eager", "torch.compile"]
    assert all(t.correct for t in result.timed)
    assert headline(result, "winner").startswith("rowsum: now ")


def test_a_child_that_fails_is_a_line_not_a_crash(tmp_path: Path) -> None:
    broken = "// kope: kernel void rowsum(const float *x, float *y, int rows, int cols)\nnot C\n"
    data = child.measure("rowsum", ROWSUM, broken, ROWSUM.parent, rounds=3, wall_s=120)
    assert set(data) == {"error"} and "exited" in data["error"]


@needs_torch
def test_kope_peers_puts_the_headline_in_report_md(pytester: pytest.Pytester) -> None:
    import shutil

    from op_repos import INI, git

    root = pytester.path
    (root / "pytest.ini").write_text(INI)
    shutil.copytree(ROWSUM.parent, root / "rowsum", ignore=shutil.ignore_patterns("__pycache__"))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "rowsum")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kope-optimize", "--kope-agent", "tuner", "--kope-budget", "3",
        "--kope-no-commit", "--kope-peers", timeout=900,
    )  # fmt: skip
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*kope rowsum: timing the winner next to its peers (--kope-peers)*"])
    (run,) = (root / ".kope" / "runs").glob("*/report.json")
    (operator,) = json.loads(run.read_text())["operators"]
    assert operator["verified"], operator
    peers = operator["peers"]
    assert peers["headline"].startswith("rowsum: now ") and peers["best_peer"] in (
        "numpy",
        "torch eager",
        "torch.compile",
    )
    assert peers["threads"] >= 1 and peers["versions"]["torch"] == torch.__version__
    md = (run.parent / "report.md").read_text()
    assert "Next to the kernel-only peers" in md and peers["headline"] in md
