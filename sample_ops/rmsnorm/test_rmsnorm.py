"""Oracle for rmsnorm.c: RMS norm over each row, with weight, eps = 1e-6."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("rmsnorm", source="rmsnorm.c", family="rowwise")

EPS = 1e-6
# tiny, prime and odd widths catch wrong vector tails; 256x1000 is a realistic batch
SHAPES = [(1, 1), (1, 16), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257), (256, 1000), (3, 4099)]


def reference(x, w):
    x64 = x.astype(np.float64)
    rms = np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS)
    return (x64 / rms * w).astype(np.float32)


def make_inputs(rng, rows, cols):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    return x, w


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_rmsnorm_matches_reference(kernel, rng, rows, cols):
    x, w = make_inputs(rng, rows, cols)
    y = np.empty_like(x)
    kernel.rmsnorm(x, w, y, rows, cols)
    assert_close(y, reference(x, w), rtol=1e-5)


def test_rmsnorm_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x, w = make_inputs(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.rmsnorm, x, w, y, rows, cols)
