"""Oracle for l2norm.c: each row divided by its L2 norm, y = x / sqrt(sum(x^2) + 1e-12)."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("l2norm", source="l2norm.c", family="rowwise")

EPS = 1e-12
# tiny, prime and odd widths catch wrong vector tails (64 = four accumulators of 16 lanes, and
# 65 one more); 256x1000 is a realistic batch
SHAPES = [
    (1, 1),
    (1, 16),
    (3, 7),
    (4, 33),
    (2, 64),
    (9, 65),
    (17, 31),
    (2, 1023),
    (127, 257),
    (256, 1000),
    (3, 4099),
]


def reference(x):
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).sum(axis=1, keepdims=True) + EPS)).astype(np.float32)


def make_input(rng, rows, cols):
    # rows of very different scales: a kernel that mixes up rows, or normalizes by the wrong one, fails
    scale = np.exp(rng.uniform(-3, 3, size=(rows, 1)))
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)


@pytest.mark.parametrize("rows,cols", [pytest.param(*s, id=f"{s[0]}x{s[1]}") for s in SHAPES])
def test_l2norm_matches_reference(kernel, rng, rows, cols):
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kernel.l2norm(x, y, rows, cols)
    assert_close(y, reference(x), rtol=1e-5)


def test_l2norm_perf(kernel, rng, kope_bench):
    rows, cols = 4096, 4096
    x = make_input(rng, rows, cols)
    y = np.empty_like(x)
    kope_bench(kernel.l2norm, x, y, rows, cols)
