"""Property-based inputs beyond the tests' (issue 33, item 6): shape inference, drawing, shrinking.

Unit tests of `shapes.infer` on recorded sizes; the drawing and the shrinking with the real sample
kernels built by gcc (the committed kernel the oracle); and one optimize run whose cheats are right
on everything the tests and the scaled copies reach but wrong beyond the tested sizes, or inside a
magnitude band: each judged incorrect with a minimal input, each honest twin crowned.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from replay_run import ROUND2, SAMPLE_OPS, ReplayRun

from pytest_kope.candidate import Candidate
from pytest_kope.judge import arrays
from pytest_kope.judge.child import callfiles, differential, drawing, draws, shapes
from pytest_kope.spec import parse_spec
from pytest_kope.toolchains.base import KernelFunction
from pytest_kope.toolchains.c import CToolchain

# --- shape inference --------------------------------------------------------------------------------


def rowsum_calls(shapes_: list[tuple[int, int]], flat: bool = False) -> list[shapes.Sized]:
    """rowsum(x, y, rows, cols): x is rows x cols (or flat), y has rows."""
    return [shapes.Sized({2: r, 3: c}, {0: (r * c,) if flat else (r, c), 1: (r,)}) for r, c in shapes_]


def test_each_dimension_follows_one_integer_argument() -> None:
    rules = shapes.infer(rowsum_calls([(1, 16), (3, 7), (4, 33)]))
    assert isinstance(rules, shapes.Rules), rules
    assert rules.dims == {0: (("arg", 2), ("arg", 3)), 1: (("arg", 2),)}
    assert rules.shape({2: 5, 3: 11}, 0) == (5, 11)
    assert rules.shape({2: 5, 3: 11}, 1) == (5,)


def test_a_flat_buffer_is_the_product_of_a_subset() -> None:
    rules = shapes.infer(rowsum_calls([(1, 16), (3, 7), (4, 33)], flat=True))
    assert isinstance(rules, shapes.Rules), rules
    assert rules.flat == {0: (1, (2, 3))}
    assert rules.shape({2: 5, 3: 11}, 0) == (55,)


def test_sgemm_sizes_and_a_constant_factor() -> None:
    """A is M*K, B is K*N, C is M*N; an interleaved complex buffer is twice n."""
    calls = [
        shapes.Sized({3: m, 4: n, 5: k}, {0: (m * k,), 1: (k * n,), 2: (m * n,)})
        for m, n, k in [(1, 1, 1), (3, 5, 7), (64, 48, 32), (17, 9, 5)]
    ]
    rules = shapes.infer(calls)
    assert isinstance(rules, shapes.Rules), rules
    assert rules.flat == {0: (1, (3, 5)), 1: (1, (4, 5)), 2: (1, (3, 4))}
    twice = shapes.infer([shapes.Sized({1: n}, {0: (2 * n,)}) for n in (3, 8, 100)])
    assert isinstance(twice, shapes.Rules) and twice.shape({1: 7}, 0) == (14,)


def test_no_rule_when_a_count_fits_no_product() -> None:
    calls = [shapes.Sized({2: n}, {0: (n * n + 1,), 1: (n,)}) for n in (2, 5, 9)]
    why = shapes.infer(calls)
    assert why == "argument #0: its element count is no single product of integer arguments"


def test_no_rule_when_two_arguments_always_agree() -> None:
    """Square matrices only: rows or cols? Drawing either would be a guess."""
    why = shapes.infer(rowsum_calls([(4, 4), (7, 7), (16, 16)]))
    assert isinstance(why, str) and "argument #0" in why, why


def test_no_rule_from_one_call_or_an_unsized_argument() -> None:
    assert isinstance(shapes.infer(rowsum_calls([(3, 7), (3, 7)])), str)
    calls = [shapes.Sized({1: n, 2: s}, {0: (n,)}) for n, s in [(4, 1), (9, 2), (30, 5)]]
    why = shapes.infer(calls)
    assert isinstance(why, str) and "#2 varies but sizes no buffer" in why, why


# --- drawing and shrinking with the real sample kernels ---------------------------------------------

SHAPES = [(1, 1), (1, 16), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257), (3, 4099)]


def built(op: str, source: str) -> dict[str, KernelFunction]:
    candidate = Candidate(source, f"{op}.c", "c", {"flags": "-O2"})
    return dict(CToolchain().build(candidate, parse_spec(source), Path(tempfile.mkdtemp())).functions)


def recorded(op: str, make: Callable[[np.random.Generator, int, int], np.ndarray]) -> differential.Recorder:
    """The committed kernel's calls on the tests' shapes, recorded as a correctness child does."""
    fn = built(op, (SAMPLE_OPS / op / f"{op}.c").read_text())[op]
    recorder, rng = differential.Recorder(), np.random.default_rng(7)
    for rows, cols in SHAPES:
        x = make(rng, rows, cols)
        y = np.empty(rows if op == "rowsum" else (rows, cols), np.float32)
        fn.raw(x, y, rows, cols)
        recorder(fn, (x, y, rows, cols), {0: x.copy()})
    return recorder


def logits(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    return (rng.standard_normal((rows, cols)) * 4).astype(np.float32)


def test_drawn_calls_reach_new_sizes_and_magnitudes_where_the_oracle_is_finite() -> None:
    calls = recorded("softmax", logits).calls
    plan = draws.plan(calls)
    assert isinstance(plan, draws.Plan), plan
    kept = drawing.draw(plan, calls[0].function)
    assert len(kept) >= 20  # MAX_KEPT, or fewer where the kernel-time budget ends it first
    tested = set(SHAPES)
    assert any((d.scalars[2], d.scalars[3]) not in tested for d, _ in kept)
    assert max(d.scalars[3] for d, _ in kept) > 4099  # wider than any test
    peaks = [d.peak for d, _ in kept if d.peak]
    assert min(peaks) < 1 < 100 < max(peaks)  # magnitudes over decades, not three points
    for d, outputs in kept:
        assert all(np.isfinite(o).all() for o in outputs.values())
        assert all(x.size <= draws.MAX_ELEMENTS for x in d.inputs.values())


def test_drawn_values_keep_the_recorded_domain() -> None:
    """Every recorded value >= 0: drawn ones too; every one an integer: drawn integers, in range."""
    positive = recorded("rowsum", lambda rng, r, c: rng.uniform(0.5, 2.0, (r, c)).astype(np.float32))
    counts = recorded("rowsum", lambda rng, r, c: rng.integers(0, 4, (r, c)).astype(np.float32))
    for recorder, domain in ((positive, "positive"), (counts, "integer")):
        plan = draws.plan(recorder.calls)
        assert isinstance(plan, draws.Plan) and plan.buffers[0].domain == domain
        for d, _ in drawing.draw(plan, recorder.calls[0].function)[:40]:
            x = d.inputs[0]
            assert (x > 0).all() if domain == "positive" else np.isin(x, [0, 1, 2, 3]).all()


def test_a_function_without_rules_is_skipped_with_a_word(tmp_path: Path) -> None:
    recorder = recorded("softmax", logits)
    for call in recorder.calls:  # every recorded call the same size: nothing to infer from
        call.scalars.update({2: 3, 3: 7})
    notes = drawing.write(recorder.calls, tmp_path / "draws")
    assert notes == [
        "property-based inputs: skipped softmax(): fewer than two recorded calls with different integer arguments"
    ]
    assert json.loads((tmp_path / "draws" / "manifest.json").read_text()) == []


def test_a_failing_draw_shrinks_to_a_minimal_input(tmp_path: Path) -> None:
    """The drawn calls a wide-row bug fails; Hypothesis shrinks the first to one row just past 4099."""
    recorder = recorded("rowsum", lambda rng, r, c: (rng.standard_normal((r, c)) + 0.5).astype(np.float32))
    folder = tmp_path / "draws"
    drawing.write(recorder.calls, folder)
    expected = differential.take_expected(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    inputs = callfiles.read(folder, "inputs", differential._input_layouts(manifest))
    cheat = built("rowsum", (ROUND2 / "rowsum" / "beyond_tested_cols.c").read_text())
    committed = built("rowsum", (SAMPLE_OPS / "rowsum" / "rowsum.c").read_text())
    failing = []
    for entry in manifest:
        x = np.array(inputs[f"{entry['key']}-a0"])
        rows, cols = entry["scalars"]["2"], entry["scalars"]["3"]
        y = np.empty(rows, np.float32)
        cheat["rowsum"].raw(x, y, rows, cols)
        want = expected[entry["key"]]["a1"]
        if arrays.mismatch(y, want, 1e-2, differential.rounding_floor(entry, want.dtype)):
            failing.append(entry["key"])  # as the judge finds it: beyond rounding
    assert failing, "no drawn call reached a width past 4099"
    smallest = drawing.shrink(folder, failing[0], cheat, committed, 1e-2)
    assert smallest.startswith("rowsum(#2=1, #3=4"), smallest  # one row, just past the tested widths
    assert "output #1: max error" in smallest, smallest


# --- the cheats, judged in an optimize run ------------------------------------------------------------

CHEATS = {"rowsum": ["beyond_tested_cols", "plain_twin"], "softmax": ["band_cheap_exp", "plain_twin"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ReplayRun:
    return ReplayRun(tmp_path_factory.mktemp("draws"), CHEATS)


@pytest.mark.parametrize("op,name", [("rowsum", "beyond_tested_cols"), ("softmax", "band_cheap_exp")])
def test_a_kernel_wrong_only_beyond_the_tests_is_incorrect_with_a_minimal_input(
    run: ReplayRun, op: str, name: str
) -> None:
    verdict = run.verdict(op, name)
    assert verdict["outcome"] == "incorrect", verdict
    assert not run.crowned(op, name)
    failure = verdict["failures"][0]
    assert "drawn by Hypothesis" in failure, failure
    assert f"minimal input (shrunk by Hypothesis): {op}(#2=" in failure, failure


@pytest.mark.parametrize("op", ["rowsum", "softmax"])
def test_the_honest_twin_is_crowned(run: ReplayRun, op: str) -> None:
    assert run.crowned(op, "plain_twin"), run.why(op, "plain_twin")


def test_no_hypothesis_folder_in_the_users_tree(run: ReplayRun) -> None:
    assert not list(run.repo.rglob(".hypothesis")), run.output[-2000:]
