"""Oracle for stencil2d.c: one sweep of a 3 x 3 stencil, "same" size, zero outside the grid.

x: rows x cols, w: 3 x 3 (row-major), y[i, j] = sum over di, dj in {-1, 0, 1} of
w[di + 1, dj + 1] * x[i + di, j + dj], x zero outside the grid.
"""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("stencil2d", source="stencil2d.c", family="stencil", flops="18*rows*cols")

# (rows, cols): one point, one row, one column, two (no interior), sizes off every row block
# (1, 2, 4) and column block (64, 256, 1024), so every kernel takes its edge paths
SHAPES = [
    (1, 1),
    (1, 7),
    (9, 1),
    (2, 2),
    (3, 3),
    (5, 65),
    (7, 257),
    (13, 1030),
    (31, 100),
    (64, 64),
]


def reference(x, w):
    xd = np.pad(x.astype(np.float64), 1)  # zeros around the grid
    wd = w.astype(np.float64).reshape(3, 3)
    rows, cols = x.shape
    y = np.zeros((rows, cols))
    for di in range(3):
        for dj in range(3):
            y += wd[di, dj] * xd[di : di + rows, dj : dj + cols]
    return y.astype(np.float32)


def make_inputs(rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(9).astype(np.float32)  # asymmetric: a transposed or flipped stencil fails
    return x, w


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id="x".join(map(str, s))) for s in SHAPES])
def test_stencil2d_matches_reference(kernel, rng, rows, cols):
    x, w = make_inputs(rng, rows, cols)
    y = np.empty((rows, cols), dtype=np.float32)
    kernel.stencil2d(x, w, y, rows, cols)
    assert_close(y, reference(x, w), rtol=1e-5)


def test_stencil2d_perf(kernel, rng, kope_bench):
    rows, cols = 1536, 2048  # 12 MiB in, 12 MiB out, 57 MFLOP a call
    x, w = make_inputs(rng, rows, cols)
    y = np.empty((rows, cols), dtype=np.float32)
    kope_bench(kernel.stencil2d, x, w, y, rows, cols)
