import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from pytest_kope import assert_close  # noqa: E402

pytestmark = pytest.mark.kope("sgemm", source="sgemm.py", family="gemm")


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (64, 48, 40), (100, 70, 130)])
def test_sgemm_matches_numpy(kernel, rng, device, m, n, k):
    a = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).to(device)
    b = torch.from_numpy(rng.standard_normal((k, n), dtype=np.float32)).to(device)
    c = torch.empty(m, n, device=device)
    kernel.sgemm(a, b, c, m, n, k)
    expected = a.cpu().numpy().astype(np.float64) @ b.cpu().numpy().astype(np.float64)
    assert_close(c.cpu().numpy(), expected, rtol=1e-5)


def test_sgemm_speed(kernel, kope_bench, device):
    if device == "cpu":
        pytest.skip("Triton on CPU runs in the interpreter; its time means nothing")
    m = n = k = 4096
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
    c = torch.empty(m, n, device=device)
    kope_bench(kernel.sgemm, a, b, c, m, n, k)
