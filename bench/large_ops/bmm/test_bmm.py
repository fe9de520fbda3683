"""Oracle for bmm.c: batched small matrix products C[b] = A[b] @ B[b] (row-major float32)."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("bmm", source="bmm.c", family="bmm", flops="2*batch*m*n*k")

# (batch, m, n, k): degenerate, one row or column, sizes off every row tile (1, 2, 4, 8) and
# column tile (8, 16, 32, 64), so every kernel takes its short-tile paths, and one batch of many
SHAPES = [
    (1, 1, 1, 1),
    (1, 3, 5, 7),
    (2, 1, 33, 9),
    (3, 17, 1, 4),
    (4, 9, 17, 31),
    (2, 48, 40, 64),
    (1, 65, 70, 3),
    (5, 7, 129, 13),
    (64, 8, 16, 32),
    (3, 33, 63, 100),
]


def reference(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)


def make_inputs(rng, batch, m, n, k):
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    # each product its own scale: a kernel that mixes up the batch fails
    b = (rng.standard_normal((batch, k, n)) * rng.uniform(0.5, 2.0, size=(batch, 1, 1))).astype(np.float32)
    return a, b


@pytest.mark.parametrize("batch,m,n,k", [pytest.param(*s, id="x".join(map(str, s))) for s in SHAPES])
def test_bmm_matches_reference(kernel, rng, batch, m, n, k):
    a, b = make_inputs(rng, batch, m, n, k)
    c = np.empty((batch, m, n), dtype=np.float32)
    kernel.bmm(a, b, c, batch, m, n, k)
    # the accumulation order differs between kernels, hence a looser tolerance than elementwise ops
    assert_close(c, reference(a, b), rtol=1e-4)


def test_bmm_perf(kernel, rng, kope_bench):
    batch, m, n, k = 768, 48, 40, 64  # 75 MFLOP a call; n = 40 is no multiple of 16, 32 or 64
    a, b = make_inputs(rng, batch, m, n, k)
    c = np.empty((batch, m, n), dtype=np.float32)
    kope_bench(kernel.bmm, a, b, c, batch, m, n, k)
