"""Oracle for cdist.c: pairwise squared Euclidean distances.

a: n x dim, b: m x dim, dist: n x m, dist[i, j] = sum over d of (a[i, d] - b[j, d]) ** 2.
"""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("cdist", source="cdist.c", family="distance", flops="3*n*m*dim")

# (n, m, dim): one distance, no coordinates (all zeros), one row or one column, row counts off every
# row tile (1, 2, 4, 8), column counts off every panel width (8..64), short and long dims
SHAPES = [
    (1, 1, 1),
    (2, 3, 0),
    (7, 13, 5),
    (9, 65, 33),
    (17, 130, 64),
    (1, 200, 3),
    (33, 1, 16),
    (40, 100, 128),
    (3, 7, 1),
    (12, 24, 2),
]


def reference(a, b):
    diff = a.astype(np.float64)[:, None, :] - b.astype(np.float64)[None, :, :]
    return (diff * diff).sum(axis=2).astype(np.float32)


def make_inputs(rng, n, m, dim):
    a = rng.standard_normal((n, dim)).astype(np.float32)
    b = rng.standard_normal((m, dim)).astype(np.float32)
    return a, b


@pytest.mark.parametrize("n,m,dim", [pytest.param(*s, id="x".join(map(str, s))) for s in SHAPES])
def test_cdist_matches_reference(kernel, rng, n, m, dim):
    a, b = make_inputs(rng, n, m, dim)
    dist = np.full((n, m), np.nan, dtype=np.float32)  # every element must be written
    kernel.cdist(a, b, dist, n, m, dim)
    # blocking changes the accumulation order, hence a looser tolerance than elementwise ops; the
    # error is relative to the largest distance, so tiny distances need no absolute floor
    assert_close(dist, reference(a, b), rtol=1e-4)


def test_cdist_perf(kernel, rng, kope_bench):
    n, m, dim = 512, 1024, 64  # 100 MFLOP a call
    a, b = make_inputs(rng, n, m, dim)
    dist = np.empty((n, m), dtype=np.float32)
    kope_bench(kernel.cdist, a, b, dist, n, m, dim)
