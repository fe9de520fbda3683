"""Oracle for logsoftmax.c: row-wise log-softmax of a rows x cols float32 matrix."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("logsoftmax", source="logsoftmax.c", family="rowwise")

# tiny, prime and odd widths catch wrong vector tails; 1100 and 4099 cross the one-pass
# kernel's 512-float blocks with a partial last block; 256x1000 is a realistic batch
SHAPES = [
    (1, 1),
    (1, 16),
    (3, 7),
    (4, 33),
    (17, 31),
    (2, 1023),
    (5, 1100),
    (127, 257),
    (256, 1000),
    (3, 4099),
]


def reference(x):
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    return (x64 - m - np.log(np.exp(x64 - m).sum(axis=1, keepdims=True))).astype(np.float32)


def make_input(rng, rows, cols):
    # scale 4 spreads logits over ~[-20, 20]: many exps far below the row max; a rising
    # trend moves the row max late in the row, so a one-pass kernel rescales its sum often
    trend = np.linspace(0.0, 6.0, cols)
    return (rng.standard_normal((rows, cols)) * 4 + trend).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_logsoftmax_matches_reference(kernel, rng, rows, cols):
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kernel.logsoftmax(x, y, rows, cols)
    # outputs are about as large as the logits' spread: float32 rounding of x - lse is ~1e-7 of it
    assert_close(y, reference(x), rtol=1e-5)


def test_logsoftmax_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.logsoftmax, x, y, rows, cols)
