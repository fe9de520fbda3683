"""conv1d's kernel (`../conv1d/conv1d.c`, the same source and space) judged at another shape: a sibling
in the conv family, for measuring what a graph that knows the family transfers (its oracle and
correctness shapes are conv1d's)."""

import numpy as np
import pytest

# conv1d's correctness tests, collected here too: under this module's marker they judge conv1d_k3
from conv1d.test_conv1d import make_inputs, test_conv1d_matches_reference  # noqa: F401

pytestmark = pytest.mark.kope(
    "conv1d_k3", source="../conv1d/conv1d.c", family="conv", flops="2*batch*cout*cin*(n-k)*k"
)


def test_conv1d_k3_perf(kernel, rng, kope_bench):
    batch, cin, cout, n, k = 4, 32, 48, 2048, 3  # 38 MFLOP a call: more channels, a shorter filter
    x, w = make_inputs(rng, batch, cin, cout, n, k)
    y = np.empty((batch, cout, n), dtype=np.float32)
    kope_bench(kernel.conv1d, x, w, y, batch, cin, cout, n, k)
