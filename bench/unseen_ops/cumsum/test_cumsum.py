"""Oracle for cumsum.c: row-wise inclusive prefix sum of a rows x cols float32 matrix."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("cumsum", source="cumsum.c", family="scan")

# row counts that are not multiples of 2 or 4 exercise the leftover-row path; widths around 4, 8
# and 16 lanes and odd widths catch wrong vector tails and carries
SHAPES = [
    (1, 1),
    (1, 16),
    (3, 7),
    (2, 17),
    (4, 33),
    (17, 31),
    (5, 64),
    (2, 1023),
    (127, 257),
    (256, 1000),
    (3, 4099),
]


def reference(x):
    return np.cumsum(x.astype(np.float64), axis=1).astype(np.float32)


def make_input(rng, rows, cols):
    # a positive offset makes the prefix sums grow along the row, so rtol means something at the end
    # of a row and every lost carry shows
    return (rng.standard_normal((rows, cols)) + 0.5).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_cumsum_matches_reference(kernel, rng, rows, cols):
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kernel.cumsum(x, y, rows, cols)
    # a float32 running sum drifts by ~sqrt(cols) roundings of the largest prefix: 2e-5 at 4099
    # columns with margin; the absolute floor bounds what cancellation leaves near zero
    assert_close(y, reference(x), rtol=2e-5, atol=2e-6 * float(np.abs(x).sum(axis=1).max()))


def test_cumsum_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.cumsum, x, y, rows, cols)
