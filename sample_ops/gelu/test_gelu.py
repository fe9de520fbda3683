"""Oracle for gelu.c: GELU, tanh approximation, elementwise over n float32 values."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("gelu", source="gelu.c", family="elementwise")

# lengths around vector widths and the kernel's 4096-element chunks, then realistic sizes
SIZES = [1, 7, 16, 17, 1000, 4095, 4097, 3 * 4096 + 5, 100_003, 256_000]


def reference(x):
    x64 = x.astype(np.float64)
    return (0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))).astype(np.float32)


def make_input(rng, n):
    # scale 3 reaches well into both tails (x in about [-15, 15])
    return (rng.standard_normal(n) * 3).astype(np.float32)


@pytest.mark.parametrize("n", SIZES)
def test_gelu_matches_reference(kernel, rng, n):
    x = make_input(rng, n)
    y = np.empty_like(x)
    kernel.gelu(x, y, n)
    # 0.5 x (1 + tanh u) in float32 cancels in the negative tail: ~|x| * 3e-8 absolute error,
    # which matters only when all of x is in that tail (n = 1), hence the small absolute floor
    assert_close(y, reference(x), rtol=1e-5, atol=1e-6)


def test_gelu_perf(kernel, rng, kope_bench):
    n = 16 * 1024 * 1024
    x = make_input(rng, n)
    y = np.empty_like(x)
    kope_bench(kernel.gelu, x, y, n)
