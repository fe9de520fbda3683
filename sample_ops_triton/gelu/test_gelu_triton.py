import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from pytest_kope import assert_close  # noqa: E402

pytestmark = pytest.mark.kope("gelu", source="gelu.py", family="elementwise")


@pytest.mark.parametrize("n", [1, 1000, 5000, 40_000])
def test_gelu_matches_torch(kernel, rng, device, n):
    x = torch.from_numpy(rng.standard_normal(n, dtype=np.float32) * 4).to(device)
    y = torch.empty_like(x)
    kernel.gelu(x, y, n)
    expected = torch.nn.functional.gelu(x.double(), approximate="tanh")
    assert_close(y.cpu().numpy(), expected.cpu().numpy(), rtol=1e-6, atol=1e-6)  # atol: gelu(-9) ~ -1e-18


def test_gelu_speed(kernel, kope_bench, device):
    if device == "cpu":
        pytest.skip("Triton on CPU runs in the interpreter; its time means nothing")
    n = 1 << 26
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    kope_bench(kernel.gelu, x, y, n)
