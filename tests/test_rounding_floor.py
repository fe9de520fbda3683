"""What the differential check forgives as rounding: one ulp of the largest input, times how many
inputs each output can sum. CI twice failed to crown an honest vectorized row sum: drawn calls mixed
+-2^32 into long rows, and two honest summation orders differed by 1 to 111 ulps of 2^32, far beyond
one. A kernel that is wrong on ordinary rows is still caught."""

from __future__ import annotations

from typing import Any

import numpy as np

from pytest_kope.judge import arrays
from pytest_kope.judge.child.differential import rounding_floor

ROWS, COLS = 24, 8199


def _rows(specials: bool) -> np.ndarray:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((ROWS, COLS)) + 0.5).astype(np.float32)
    if specials:
        for r in range(ROWS):
            x[r, rng.integers(0, COLS, 6)] = np.float32(2.0**32) * np.array([1, -1] * 3, np.float32)
    return x


def _entry(x: np.ndarray) -> dict[str, Any]:
    return {
        "input_peak": float(np.abs(x).max()),
        "inputs": {"0": [list(x.shape), x.dtype.str]},
        "outputs": {"1": [[x.shape[0]], "<f4"]},
    }


def test_two_honest_summation_orders_differ_only_by_rounding():
    x = _rows(specials=True)
    sequential = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]  # the committed kernel's order
    pairwise = x.sum(axis=1, dtype=np.float32)  # a vectorized candidate's
    one_ulp = float(np.abs(x).max()) * float(np.finfo(np.float32).eps)
    assert arrays.mismatch(pairwise, sequential, 0.01, one_ulp)  # what the check forgave before
    assert arrays.mismatch(pairwise, sequential, 0.01, rounding_floor(_entry(x), np.dtype(np.float32))) == ""


def test_small_values_absorbed_by_huge_partial_sums_differ_by_many_ulps_in_honest_orders():
    """The second CI case: mostly positive values over five decades, four +-2^32 a row: each value
    under half an ulp of 2^32 is lost or kept by where the partial sums stand."""
    rng = np.random.default_rng(3)
    x = (10.0 ** rng.uniform(-2.55, 2.55, (36, 6945))).astype(np.float32)
    for r in range(36):
        x[r, rng.integers(0, 6945, 4)] = np.float32(2.0**32) * np.array([1, -1, 1, -1], np.float32)
    sequential = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]
    lanes = x[:, :6944].reshape(36, -1, 16).sum(axis=1, dtype=np.float32)  # 16 partial sums a row
    vectorized = lanes.sum(axis=1, dtype=np.float32) + x[:, 6944]
    one_ulp = 2.0**32 * float(np.finfo(np.float32).eps)
    assert np.abs(sequential - vectorized).max() > 100 * one_ulp  # far beyond sqrt(6945) = 83 ulps
    assert (
        arrays.mismatch(vectorized, sequential, 0.01, rounding_floor(_entry(x), np.dtype(np.float32))) == ""
    )


def test_a_row_sum_that_drops_each_rows_tail_is_still_wrong():
    x = _rows(specials=False)
    want = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]
    dropped = x[:, : COLS - 7].sum(axis=1, dtype=np.float32)
    assert arrays.mismatch(dropped, want, 1e-4, rounding_floor(_entry(x), np.dtype(np.float32)))


def test_elementwise_calls_keep_one_ulp_of_the_largest_input():
    entry = {"input_peak": 8.0, "inputs": {"0": [[100], "<f4"]}, "outputs": {"1": [[100], "<f4"]}}
    assert rounding_floor(entry, np.dtype(np.float32)) == 8.0 * float(np.finfo(np.float32).eps)


def _sequential(inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    return {1: np.cumsum(inputs[0], axis=1, dtype=np.float32)[:, -1]}


def test_the_committed_kernels_own_error_forgives_another_order_on_a_run_of_equal_values():
    """A float32 sum along 4000 equal values rounds the same way 4000 times: the committed kernel is
    itself far from the truth there, and an honest pairwise sum far from it. Its own error, measured
    as f(3x)/3 against f(x) (`noise.py`), forgives the pairwise sum; a sum that drops one element is
    still wrong beyond it."""
    from pytest_kope.judge.child import noise

    x = (np.random.default_rng(4).standard_normal((4, 8199)) + 5).astype(np.float32)
    x[:, 1000:5000] = np.float32(7.3)
    want = _sequential({0: x})
    own = noise.own_error(_sequential, {0: x}, want)
    assert own is not None
    pairwise = x.sum(axis=1, dtype=np.float32)
    assert arrays.mismatch(pairwise, want[1], 2e-5)  # the tests' bar alone rejects an honest order
    assert arrays.mismatch(pairwise, want[1], 2e-5 + own) == ""
    dropped = x[:, 100:].sum(axis=1, dtype=np.float32)
    assert arrays.mismatch(dropped, want[1], 2e-5 + own)


def test_a_kernel_whose_outputs_do_not_scale_with_its_inputs_is_measured_by_its_inputs_rounding():
    from pytest_kope.judge.child import noise

    x = (1000 + 2 * np.random.default_rng(5).standard_normal((3, 50))).astype(np.float32)

    def softmax(inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        z = inputs[0] - inputs[0].max(axis=1, keepdims=True)
        e = np.exp(z, dtype=np.float32)
        return {1: e / e.sum(axis=1, keepdims=True, dtype=np.float32)}

    own = noise.own_error(softmax, {0: x}, softmax({0: x}))
    assert own is not None and own > 1e-5  # logits of 10^3 lose about 6e-5 of their exponent to rounding


def _rmsnorm(inputs: dict[int, np.ndarray], pairwise: bool = False) -> dict[int, np.ndarray]:
    """x / sqrt(mean(x^2) + 1e-6) * w in float32, the sum of squares sequential (the committed
    kernel's order) or pairwise (a vectorized candidate's)."""
    x, w = inputs[0], inputs[1]
    sq = x * x
    q = sq.sum(axis=1, dtype=np.float32) if pairwise else np.cumsum(sq, axis=1, dtype=np.float32)[:, -1]
    rrms = np.float32(1) / np.sqrt(q / np.float32(x.shape[1]) + np.float32(1e-6))
    return {2: x * rrms[:, None] * w}


def test_a_normalization_with_an_eps_is_measured_where_the_eps_is_below_rounding():
    """An eps keeps rmsnorm from scaling bit for bit with its inputs, so f(3x)/3^k says nothing at
    x itself; at x * 2^12 the eps is below rounding and the sum of squares rounds as at x (the same
    mantissas). Over rows of 4100 equal values a sequential and a pairwise sum of squares give outputs
    2.2e-5 apart (a CI run's drawn call: 1.6e-5, the sample kernel 4e-5 from the truth): the pairwise
    order is forgiven, a kernel that ignores the eps is not."""
    from pytest_kope.judge.child import noise

    rng = np.random.default_rng(6)
    x = (0.006 + 0.001 * rng.standard_normal((8, 4100))).astype(np.float32)
    x[2:6] = np.float32(0.015245614)
    w = rng.standard_normal(4100).astype(np.float32)
    want = _rmsnorm({0: x, 1: w})
    own = noise.own_error(_rmsnorm, {0: x, 1: w}, want)
    assert own is not None
    honest = _rmsnorm({0: x, 1: w}, pairwise=True)[2]
    assert arrays.mismatch(honest, want[2], 1e-5)  # the tests' bar alone rejects an honest order
    assert arrays.mismatch(honest, want[2], 1e-5 + own) == ""
    q = np.cumsum(x * x, axis=1, dtype=np.float32)[:, -1]
    no_eps = x * (np.float32(1) / np.sqrt(q / np.float32(4100)))[:, None] * w
    assert arrays.mismatch(no_eps, want[2], 1e-5 + own)


def test_equal_runs_are_counted_in_memory_order():
    assert arrays.equal_run(np.array([1, 2, 2, 2, 3, 3], np.float32)) == 3
    assert (
        arrays.equal_run(np.array([0, 0, 0, np.inf, np.inf, 5], np.float32)) == 1
    )  # zeros and inf round nothing
    assert arrays.equal_run(np.arange(6, dtype=np.float32)) == 1


def _lanes(x: np.ndarray, lanes: int = 16) -> np.ndarray:
    """A vectorized row sum: `lanes` partial sums a row, then their sum (the tail added last)."""
    whole = x.shape[1] // lanes * lanes
    partial = x[:, :whole].reshape(x.shape[0], -1, lanes).sum(axis=1, dtype=np.float32)
    summed: np.ndarray = partial.sum(axis=1, dtype=np.float32) + x[:, whole:].sum(axis=1, dtype=np.float32)
    return summed


def test_a_run_of_one_value_rounds_the_same_way_at_every_step_and_the_floor_grows_with_it():
    """The third CI case: a drawn row of 8,199 positive values, most of them one value (a constant
    block), summed to 374 by the committed kernel in order; an honest 16-lane sum was 0.0206 away,
    48 times the floor of one ulp of the largest input per term. Along a run every step rounds alike,
    so the floor is an ulp of the partial sums per value of the run; a tail dropped on random rows
    is still wrong (above)."""
    rng = np.random.default_rng(5)
    x = (10.0 ** rng.normal(-2.33, 0.5, (4, COLS))).astype(np.float32)
    x[:, 1500:7700] = np.float32(0.0413)  # its additions round alike: the sums end 4.7e-5 apart
    sequential = np.cumsum(x, axis=1, dtype=np.float32)[:, -1]
    entry = {**_entry(x), "equal_run": arrays.equal_run(x)}
    old = rounding_floor(_entry(x), np.dtype(np.float32), float(np.abs(sequential).max()))
    new = rounding_floor(entry, np.dtype(np.float32), float(np.abs(sequential).max()))
    assert arrays.mismatch(_lanes(x), sequential, 2e-5, old)  # what the check held against it before
    assert arrays.mismatch(_lanes(x), sequential, 2e-5, new) == ""
    assert arrays.mismatch(x[:, : COLS - 2000].sum(axis=1, dtype=np.float32), sequential, 2e-5, new)


def _softmax(x: np.ndarray, lanes: int) -> np.ndarray:
    """A float32 softmax whose denominator is summed in `lanes` partial sums (1: in order)."""
    e = np.exp(x - x.max(axis=1, keepdims=True)).astype(np.float32)
    total = np.cumsum(e, axis=1, dtype=np.float32)[:, -1] if lanes == 1 else _lanes(e, lanes)
    out: np.ndarray = (e / total[:, None]).astype(np.float32)
    return out


def test_a_run_inside_a_call_whose_outputs_each_read_one_input_widens_the_floor_too():
    """The fourth CI case: a softmax reads as many values as it writes (`terms` 1), yet each output is
    divided by a sum over its row, and along a constant block that sum rounds alike at every step; an
    honest 16-lane softmax was 1.5e-4 of its peak from the sequential one on 4,111 values a row. The
    outputs move relative to their peak, so the run bounds the floor whatever `terms` says; a kernel
    that drops part of the block is still wrong."""
    rng = np.random.default_rng(3)
    cols = 4111
    x = (rng.choice([-1.0, 1.0], (4, cols)) * 10.0 ** rng.uniform(-1, 1, (4, cols))).astype(np.float32)
    x[:, 600:4000] = np.float32(1.7)  # a constant block: the denominators' additions round alike
    sequential, lanes = _softmax(x, 1), _softmax(x, 16)
    peak = float(np.abs(sequential).max())
    base = {**_entry(x), "outputs": {"1": [list(x.shape), "<f4"]}}
    old = arrays.rounding_floor(base["input_peak"], x.size, x.size, np.dtype(np.float32), 1, peak)
    new = rounding_floor({**base, "equal_run": arrays.equal_run(x)}, np.dtype(np.float32), peak)
    assert arrays.mismatch(lanes, sequential, 1e-6, old)  # beyond what the floor held before
    assert arrays.mismatch(lanes, sequential, 1e-6, new) == ""
    dropped = _softmax(np.concatenate([x[:, :600], x[:, 3000:]], axis=1), 1)  # 2,400 of the block gone
    assert arrays.mismatch(dropped[:, :600], sequential[:, :600], 1e-6, new)
