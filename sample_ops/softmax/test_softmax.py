"""Oracle for softmax.c: row-wise softmax of a rows x cols float32 matrix."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("softmax", source="softmax.c", family="rowwise")

# tiny, prime and odd widths catch wrong vector tails; 256x1000 is a realistic batch
SHAPES = [(1, 1), (1, 16), (3, 7), (4, 33), (17, 31), (2, 1023), (127, 257), (256, 1000), (3, 4099)]


def reference(x):
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def make_input(rng, rows, cols):
    # scale 4 spreads logits over ~[-20, 20]: many exps far below the row max
    return (rng.standard_normal((rows, cols)) * 4).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_softmax_matches_reference(kernel, rng, rows, cols):
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kernel.softmax(x, y, rows, cols)
    # a plain float32 sum of 4099 exps drifts by up to ~1.5e-5 relative: allow it with margin
    assert_close(y, reference(x), rtol=1e-4)


def test_softmax_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.softmax, x, y, rows, cols)
