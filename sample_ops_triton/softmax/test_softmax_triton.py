import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from pytest_kope import assert_close  # noqa: E402

pytestmark = pytest.mark.kope("softmax", source="softmax.py", family="rowwise")


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 100), (4, 1000), (2, 3000)])
def test_softmax_matches_torch(kernel, rng, device, rows, cols):
    x = torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32) * 8).to(device)
    y = torch.empty_like(x)
    kernel.softmax(x, y, rows, cols)
    assert_close(y.cpu().numpy(), torch.softmax(x.double(), dim=1).cpu().numpy(), rtol=1e-5)


def test_softmax_speed(kernel, kope_bench, device):
    if device == "cpu":
        pytest.skip("Triton on CPU runs in the interpreter; its time means nothing")
    rows, cols = 4096, 4096
    x = torch.randn(rows, cols, device=device)
    y = torch.empty_like(x)
    kope_bench(kernel.softmax, x, y, rows, cols)
