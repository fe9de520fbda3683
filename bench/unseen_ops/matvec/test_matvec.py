"""Oracle for matvec.c: batched matrix-vector product y[b] = A[b] @ x[b] (A[b]: m x n, row-major)."""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("matvec", source="matvec.c", family="gemv")

# (batch, m, n): degenerate, one row or one column, row counts that are not multiples of 2 or 4
# (a short last block of rows in every matrix), widths around and off every vector width
SHAPES = [
    (1, 1, 1),
    (1, 3, 7),
    (2, 17, 31),
    (3, 33, 1),
    (5, 1, 100),
    (2, 6, 64),
    (4, 127, 257),
    (2, 65, 1023),
    (1, 5, 4099),
    (8, 256, 1000),
]


def reference(a, x):
    return np.einsum("bmn,bn->bm", a.astype(np.float64), x.astype(np.float64)).astype(np.float32)


def make_inputs(rng, batch, m, n):
    a = rng.standard_normal((batch, m, n)).astype(np.float32)
    # each batch's own vector, of its own scale: a kernel that reuses one batch's x fails
    x = (rng.standard_normal((batch, n)) * rng.uniform(0.5, 2.0, size=(batch, 1))).astype(np.float32)
    return a, x


@pytest.mark.parametrize("batch,m,n", [pytest.param(*s, id="x".join(map(str, s))) for s in SHAPES])
def test_matvec_matches_reference(kernel, rng, batch, m, n):
    a, x = make_inputs(rng, batch, m, n)
    y = np.empty((batch, m), dtype=np.float32)
    kernel.matvec(a, x, y, batch, m, n)
    # accumulation order differs between kernels, hence a looser tolerance than elementwise ops
    assert_close(y, reference(a, x), rtol=1e-4)


def test_matvec_perf(kernel, rng, kope_bench):
    batch, m, n = 16, 1024, 1024  # A is 64 MiB: read once per call
    a, x = make_inputs(rng, batch, m, n)
    y = np.empty((batch, m), dtype=np.float32)
    kope_bench(kernel.matvec, a, x, y, batch, m, n)
