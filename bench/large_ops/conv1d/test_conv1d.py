"""Oracle for conv1d.c: batched multi-channel 1-D convolution (cross-correlation, "same" size).

x: batch x cin x n, w: cout x cin x k, y: batch x cout x n, with p = (k - 1) // 2,
y[b, o, i] = sum over c, t of w[o, c, t] * x[b, c, i + t - p], x zero outside [0, n).
"""

import numpy as np
import pytest

from pytest_kope import assert_close

pytestmark = pytest.mark.kope("conv1d", source="conv1d.c", family="conv", flops="2*batch*cout*cin*(n-k)*k")

# (batch, cin, cout, n, k): one output, one tap, filters longer than the row (every output near an
# edge), row lengths off every block width (8..128), output-channel counts off every channel block
# (1, 2, 4); k = 3, 5, 7 take the constant-tap kernels, other k (1, 2, 9, 64) the generic one
SHAPES = [
    (1, 1, 1, 1, 1),
    (1, 1, 1, 5, 3),
    (2, 3, 5, 17, 3),
    (1, 2, 3, 40, 5),
    (3, 4, 7, 129, 7),
    (2, 5, 6, 300, 9),
    (1, 3, 2, 1000, 1),
    (2, 16, 16, 263, 7),
    (1, 1, 9, 64, 64),
    (2, 2, 3, 5, 9),
    (1, 3, 4, 2, 3),
    (2, 2, 4, 200, 2),
    (1, 6, 5, 531, 5),
]


def reference(x, w):
    n, k = x.shape[2], w.shape[2]
    p = (k - 1) // 2
    xd = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, k - 1 - p)))  # zeros beyond both ends
    wd = w.astype(np.float64)
    y = np.zeros((x.shape[0], w.shape[0], n))
    for t in range(k):
        y += np.einsum("oc,bci->boi", wd[:, :, t], xd[:, :, t : t + n])
    return y.astype(np.float32)


def make_inputs(rng, batch, cin, cout, n, k):
    x = rng.standard_normal((batch, cin, n)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, k)) / np.sqrt(cin * k)).astype(np.float32)
    return x, w


@pytest.mark.parametrize("batch,cin,cout,n,k", [pytest.param(*s, id="x".join(map(str, s))) for s in SHAPES])
def test_conv1d_matches_reference(kernel, rng, batch, cin, cout, n, k):
    x, w = make_inputs(rng, batch, cin, cout, n, k)
    y = np.empty((batch, cout, n), dtype=np.float32)
    kernel.conv1d(x, w, y, batch, cin, cout, n, k)
    # blocking changes the accumulation order, hence a looser tolerance than elementwise ops
    assert_close(y, reference(x, w), rtol=1e-4)


def test_conv1d_perf(kernel, rng, kope_bench):
    batch, cin, cout, n, k = 12, 16, 16, 4096, 7  # 88 MFLOP a call
    x, w = make_inputs(rng, batch, cin, cout, n, k)
    y = np.empty((batch, cout, n), dtype=np.float32)
    kope_bench(kernel.conv1d, x, w, y, batch, cin, cout, n, k)
