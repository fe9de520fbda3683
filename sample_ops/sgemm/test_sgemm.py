"""Oracle for sgemm.c: C = A @ B for row-major float32 matrices (A: M x K, B: K x N)."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("sgemm", source="sgemm.c", family="gemm", flops="2*M*N*K")

# (M, N, K): degenerate, prime, square, and sizes that leave partial tiles and
# several K slices in every tiling the kernel declares
SHAPES = [
    (1, 1, 1),
    (3, 5, 7),
    (17, 31, 13),
    (64, 64, 64),
    (1, 100, 300),
    (70, 1, 65),
    (129, 67, 255),
    (7, 129, 513),
]


def reference(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def make_inputs(rng, m, n, k):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b


@pytest.mark.parametrize("m,n,k", [pytest.param(*s, id="x".join(map(str, s))) for s in SHAPES])
def test_sgemm_matches_reference(kernel, rng, m, n, k):
    a, b = make_inputs(rng, m, n, k)
    c = np.empty((m, n), dtype=np.float32)
    kernel.sgemm(a, b, c, m, n, k)
    # blocking changes the accumulation order, hence a looser tolerance than elementwise ops
    assert_close(c, reference(a, b), rtol=1e-4)


def test_sgemm_perf(kernel, rng, kope_bench):
    m = n = k = 1024
    a, b = make_inputs(rng, m, n, k)
    c = np.empty((m, n), dtype=np.float32)
    kope_bench(kernel.sgemm, a, b, c, m, n, k)
