"""Oracle for layernorm.c: layer norm over each row, with weight and bias, eps = 1e-5."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("layernorm", source="layernorm.c", family="rowwise")

EPS = 1e-5
# tiny, prime and odd widths catch wrong vector tails; 256x1000 is a realistic batch
SHAPES = [(1, 1), (1, 16), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257), (256, 1000), (3, 4099)]


def reference(x, w, b):
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=1, keepdims=True)
    return ((x64 - mean) / np.sqrt(var + EPS) * w + b).astype(np.float32)


def make_inputs(rng, rows, cols):
    # an offset mean makes a one-pass variance (E[x^2] - E[x]^2) visibly wrong
    x = (rng.standard_normal((rows, cols)) * 2 + 3).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_layernorm_matches_reference(kernel, rng, rows, cols):
    x, w, b = make_inputs(rng, rows, cols)
    y = np.empty_like(x)
    kernel.layernorm(x, w, b, y, rows, cols)
    assert_close(y, reference(x, w, b), rtol=2e-5)


def test_layernorm_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x, w, b = make_inputs(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.layernorm, x, w, b, y, rows, cols)
