"""Small pieces on their own: the kernel header, statistics, screening, the tuner's search, replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pytest_kope.agents.base import Context, OperatorInfo
from pytest_kope.agents.replay import Replay
from pytest_kope.agents.tuner.agent import Tuner
from pytest_kope.candidate import Candidate
from pytest_kope.errors import ConfigError, SpecError
from pytest_kope.judge.measure.stats import PairedRatio, median_ci
from pytest_kope.judge.outcome import Judged, Outcome
from pytest_kope.operator import base_nodeid
from pytest_kope.spec import bake_defaults, parse_spec
from pytest_kope.toolchains.c import CToolchain, parse_prototype

HEADER = """\
// kope: kernel void f(const float *x, float *y, int n)
// kope: param BLOCK = 8 | 16 | 32
// kope: flags -O2 | -O3 -march=native
// kope: require BLOCK >= 16 or flags == "-O2"
// kope: inplace y
"""


def test_header_parses_space_defaults_constraints_and_roles() -> None:
    spec = parse_spec(HEADER, "f.c")
    assert spec.kernels == ("void f(const float *x, float *y, int n)",)
    assert spec.space.defaults == {"BLOCK": 8, "flags": "-O2"}
    assert {"BLOCK": 8, "flags": "-O3 -march=native"} not in list(spec.space.points())
    assert len(list(spec.space.points())) == 5 and spec.inplace == {"y"}
    name, args, dtypes = parse_prototype(spec.kernels[0])
    assert (
        name == "f" and [a.role for a in args] == ["in", "out", "scalar"] and dtypes == ["float32", "float32"]
    )


def test_bad_header_line_names_file_and_line() -> None:
    with pytest.raises(SpecError, match=r"k\.c:2: write `kope: param NAME = default"):
        parse_spec("int x;\n// kope: param = 1 | 2\n", "k.c")
    with pytest.raises(SpecError, match="unknown declaration 'tune'"):
        parse_spec("// kope: tune X\n", "k.c")


def test_bake_moves_the_winner_to_the_front_so_the_file_builds_it() -> None:
    baked = bake_defaults(HEADER, {"BLOCK": 32, "flags": "-O3 -march=native"})
    assert parse_spec(baked).space.defaults == {"BLOCK": 32, "flags": "-O3 -march=native"}
    assert "BLOCK = 32 | 8 | 16" in baked


def test_median_interval_is_distribution_free_and_widest_for_few_rounds() -> None:
    assert median_ci([1, 2, 3, 4, 5]) == (1, 5)
    assert median_ci(list(range(30))) == (9, 20)
    assert PairedRatio.of([2.0] * 9, [1.0] * 9).beats(0.05)
    noisy = PairedRatio.of([1.0, 1.3, 0.8, 1.2, 0.9, 1.1, 1.0], [1.0] * 7)
    assert not noisy.beats(0.05)


def test_screen_refuses_forbidden_calls_flags_and_define_values() -> None:
    c = CToolchain()
    assert c.screen(Candidate('void f(void){ system("rm -rf /"); }', "f.c", "c")) != []
    assert c.screen(Candidate("/* system() in a comment is fine */ int x;", "f.c", "c")) == []
    assert c.screen(Candidate("int x;", "f.c", "c", {"flags": "-O3 -march=native -fno-math-errno"})) == []
    assert c.screen(Candidate("int x;", "f.c", "c", {"flags": "-O2 -fplugin=/tmp/evil.so"}))
    assert c.screen(Candidate("int x;", "f.c", "c", {"flags": "-O2 -include /proc/1/environ"}))
    assert c.screen(Candidate("int x;", "f.c", "c", {"VEC": '8); system("x"'}))


def test_base_nodeid_strips_the_candidate_and_seed_parameters() -> None:
    assert base_nodeid("t.py::test_a[kope-0123abcd-kope-seed42-3-7]") == "t.py::test_a[3-7]"
    assert base_nodeid("t.py::test_b[kope-0123abcd]") == "t.py::test_b"


def context(source: str, seen=lambda h: False, recall=None) -> Context:
    spec = parse_spec(source)
    base = Candidate(source, "f.c", "c", spec.space.defaults, "committed kernel", "baseline")
    judged = Judged(base, Outcome.OK, speedup=1.0)
    info = OperatorInfo("f", "elementwise", "c", "f.c", source, spec.space, spec.kernels)
    return Context(info, {}, judged, judged, [], 10, recall or (lambda **_: None), seen)


def test_tuner_proposes_unseen_points_and_learns_from_verdicts() -> None:
    tuner, ctx = Tuner(seed=1), context(HEADER)
    first = tuner.propose(ctx, 2)
    assert len(first) == 2 and len({c.hash for c in first}) == 2
    assert all(
        c.parent == ctx.baseline.candidate.hash and c.params != ctx.baseline.candidate.params for c in first
    )
    tuner.observe(ctx, [Judged(first[0], Outcome.BETTER, speedup=3.0), Judged(first[1], Outcome.INCORRECT)])
    rest = tuner.propose(ctx, 10)
    assert {c.hash for c in rest}.isdisjoint(c.hash for c in first) and len(
        rest
    ) == 2  # 5 points - default - 2
    assert tuner.propose(ctx, 5) == []


def test_tuner_starts_from_what_this_operator_showed_before_on_this_hardware() -> None:
    class Recalled:  # past attempts, as recall(points=True) returns them: the best one is 3x
        points = [
            {"source": "f#1", "relation": "operator/hardware", "params": p, "speedup": s, "correct": True}
            for p, s in [
                ({"BLOCK": 8, "flags": "-O2"}, 1.0),
                ({"BLOCK": 16, "flags": "-O2"}, 1.2),
                ({"BLOCK": 32, "flags": "-O2"}, 1.3),
                ({"BLOCK": 16, "flags": "-O3 -march=native"}, 2.2),
                ({"BLOCK": 32, "flags": "-O3 -march=native"}, 3.0),
            ]
        ]

    for seed in range(5):  # the graph arm goes first, and the graph says where the best point is
        first = Tuner(seed=seed).propose(context(HEADER, recall=lambda **_: Recalled()), 1)
        assert first[0].params == {"BLOCK": 32, "flags": "-O3 -march=native"}


def test_replay_reads_files_and_sidecars_once_each(tmp_path) -> None:
    folder = tmp_path / "cands" / "f"
    folder.mkdir(parents=True)
    (folder / "a.c").write_text(HEADER + "void f(const float *x, float *y, int n) {}\n")
    (folder / "a.json").write_text(json.dumps({"idea": "blocked", "params": {"BLOCK": 16}}))
    (folder / "b.c").write_text("void f(const float *x, float *y, int n) {}\n")
    agent, ctx = Replay(tmp_path / "cands"), context(HEADER)
    got = agent.propose(ctx, 5)
    assert [c.idea for c in got] == ["blocked", "replayed b.c"]
    assert got[0].params == {"BLOCK": 16, "flags": "-O2"} and agent.propose(ctx, 5) == []
    with pytest.raises(ConfigError, match="is not a folder"):
        Replay(tmp_path / "missing")


def test_digest_sees_any_one_word_change_and_a_swap() -> None:
    """The guards' change detector: a flipped low bit anywhere, two words swapped, a tail byte."""
    from pytest_kope.judge import arrays

    x = np.random.default_rng(7).standard_normal(100_003).astype(np.float32)  # words and a tail
    seen = arrays.digest(x)
    assert arrays.digest(x.copy()) == seen
    for where in (0, 1, 4097, 65_536, 100_002):
        y = x.copy()
        y.view(np.uint32)[where] ^= 1
        assert arrays.digest(y) != seen, where
    z = x.copy()
    z[10], z[11] = x[11], x[10]
    assert arrays.digest(z) != seen


def test_unwritten_counts_the_poison_left_in_every_chunk() -> None:
    from pytest_kope.judge import arrays

    y = np.empty((300, 1000), np.float32)
    arrays.poison(y)
    y[:, :999] = 1.0
    assert arrays.unwritten(y) == 300
    assert arrays.unwritten(np.ones(5, np.float64)) == 0
