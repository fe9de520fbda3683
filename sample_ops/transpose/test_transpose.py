"""Oracle for transpose.c: y = x.T for a row-major rows x cols float32 matrix (exact)."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("transpose", source="transpose.c", family="layout")

# single rows and columns, primes and sizes that are not multiples of any tile size
SHAPES = [(1, 1), (1, 9), (9, 1), (3, 7), (17, 31), (64, 64), (33, 65), (127, 257), (256, 1000)]


def reference(x):
    return np.ascontiguousarray(x.T)


def make_input(rng, rows, cols):
    return rng.standard_normal((rows, cols)).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_transpose_matches_reference(kernel, rng, rows, cols):
    x = make_input(rng, rows, cols)
    y = np.empty((cols, rows), dtype=np.float32)
    kernel.transpose(x, y, rows, cols)
    assert_close(y, reference(x), rtol=0.0)  # a transpose moves values: exact


def test_transpose_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x = make_input(rng, rows, cols)
    y = np.empty((cols, rows), dtype=np.float32)
    kope_bench(kernel.transpose, x, y, rows, cols)
