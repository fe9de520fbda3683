"""bmm's kernel (`../bmm/bmm.c`, the same source and space) judged at another shape: a sibling in the
bmm family, for measuring what a graph that knows the family transfers (its oracle and correctness
shapes are bmm's)."""

import numpy as np
import pytest

# bmm's correctness tests, collected here too: under this module's marker they judge bmm_wide
from bmm.test_bmm import make_inputs, test_bmm_matches_reference  # noqa: F401

pytestmark = pytest.mark.kope("bmm_wide", source="../bmm/bmm.c", family="bmm", flops="2*batch*m*n*k")


def test_bmm_wide_perf(kernel, rng, kope_bench):
    batch, m, n, k = 256, 32, 96, 96  # 38 MFLOP a call: wider and deeper products, fewer of them
    a, b = make_inputs(rng, batch, m, n, k)
    c = np.empty((batch, m, n), dtype=np.float32)
    kope_bench(kernel.bmm, a, b, c, batch, m, n, k)
