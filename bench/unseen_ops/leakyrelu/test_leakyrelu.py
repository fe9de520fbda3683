"""Oracle for leakyrelu.c: leaky ReLU with slope 0.01, elementwise over n float32 values (exact)."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("leakyrelu", source="leakyrelu.c", family="elementwise")

# lengths around vector widths and the kernel's 4096-element chunks, then realistic sizes
SIZES = [1, 7, 16, 17, 1000, 4095, 4097, 3 * 4096 + 5, 100_003, 256_000]


def reference(x):
    return np.where(x > 0, x, np.float32(0.01) * x).astype(np.float32)


def make_input(rng, n):
    # both signs, and exact zeros (either form must give 0 there)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < 0.05] = 0.0
    return x


@pytest.mark.parametrize("n", SIZES)
def test_leakyrelu_matches_reference(kernel, rng, n):
    x = make_input(rng, n)
    y = np.empty_like(x)
    kernel.leakyrelu(x, y, n)
    # one float32 multiply or none: the kernel must give the reference's values exactly
    assert_close(y, reference(x), rtol=0.0)


def test_leakyrelu_perf(kernel, rng, kope_bench):
    n = 16 * 1024 * 1024
    x = make_input(rng, n)
    y = np.empty_like(x)
    kope_bench(kernel.leakyrelu, x, y, n)
