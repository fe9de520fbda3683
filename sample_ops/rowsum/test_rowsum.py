"""Oracle for rowsum.c: y[r] = sum of row r of a rows x cols float32 matrix."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("rowsum", source="rowsum.c", family="rowwise", flops="rows*(cols-1)")

# row counts that are not multiples of 2 or 4 exercise the leftover-row path
SHAPES = [(1, 1), (1, 16), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257), (256, 1000), (3, 4099)]


def reference(x):
    return x.astype(np.float64).sum(axis=1).astype(np.float32)


def make_input(rng, rows, cols):
    # a positive offset keeps row sums well away from zero, so rtol means something
    return (rng.standard_normal((rows, cols)) + 0.5).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_rowsum_matches_reference(kernel, rng, rows, cols):
    x = make_input(rng, rows, cols)
    y = np.empty(rows, dtype=np.float32)
    kernel.rowsum(x, y, rows, cols)
    # a row can sum to nearly zero by cancellation: bound the error by the row's magnitude too
    assert_close(y, reference(x), rtol=2e-5, atol=2e-6 * float(np.abs(x).sum(axis=1).max()))


def test_rowsum_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x = make_input(rng, rows, cols)
    y = np.empty(rows, dtype=np.float32)
    kope_bench(kernel.rowsum, x, y, rows, cols)
