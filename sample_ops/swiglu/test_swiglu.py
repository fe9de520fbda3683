"""Oracle for swiglu.c: y = silu(a) * b, elementwise over n float32 values."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("swiglu", source="swiglu.c", family="elementwise")

# lengths around vector widths and the kernel's 4096-element chunks, then realistic sizes
SIZES = [1, 7, 16, 17, 1000, 4095, 4097, 3 * 4096 + 5, 100_003, 256_000]


def reference(a, b):
    a64 = a.astype(np.float64)
    return (a64 / (1 + np.exp(-a64)) * b).astype(np.float32)


def make_inputs(rng, n):
    # scale 4 on the gate reaches far into both tails of the sigmoid
    a = (rng.standard_normal(n) * 4).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return a, b


@pytest.mark.parametrize("n", SIZES)
def test_swiglu_matches_reference(kernel, rng, n):
    a, b = make_inputs(rng, n)
    y = np.empty_like(a)
    kernel.swiglu(a, b, y, n)
    assert_close(y, reference(a, b), rtol=1e-5)


def test_swiglu_perf(kernel, rng, kope_bench):
    n = 16 * 1024 * 1024
    a, b = make_inputs(rng, n)
    y = np.empty_like(a)
    kope_bench(kernel.swiglu, a, b, y, n)
