"""Oracle for addlayernorm.c: layer norm of x + res over each row, with weight and bias, eps = 1e-5."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("addlayernorm", source="addlayernorm.c", family="rowwise")

EPS = 1e-5
# tiny, prime and odd widths catch wrong vector tails; 256x1000 is a realistic batch
SHAPES = [(1, 1), (1, 16), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257), (256, 1000), (3, 4099)]


def reference(x, res, w, b):
    h = x.astype(np.float64) + res.astype(np.float64)
    mean = h.mean(axis=1, keepdims=True)
    var = ((h - mean) ** 2).mean(axis=1, keepdims=True)
    return ((h - mean) / np.sqrt(var + EPS) * w + b).astype(np.float32)


def make_inputs(rng, rows, cols):
    # offset means make a one-pass variance (E[h^2] - E[h]^2) visibly wrong; the residual carries
    # most of the offset, so a kernel that drops it or adds it twice fails too
    x = (rng.standard_normal((rows, cols)) * 2 + 1).astype(np.float32)
    res = (rng.standard_normal((rows, cols)) + 4).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    return x, res, w, b


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_addlayernorm_matches_reference(kernel, rng, rows, cols):
    x, res, w, b = make_inputs(rng, rows, cols)
    y = np.empty_like(x)
    kernel.addlayernorm(x, res, w, b, y, rows, cols)
    assert_close(y, reference(x, res, w, b), rtol=2e-5)


def test_addlayernorm_perf(kernel, rng, kope_bench):
    rows, cols = 2048, 4096  # x, res and y are 32 MiB each
    x, res, w, b = make_inputs(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.addlayernorm, x, res, w, b, y, rows, cols)
