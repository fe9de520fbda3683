import numpy as np
import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from pytest_kope import assert_close  # noqa: E402

pytestmark = pytest.mark.kope("layernorm", source="layernorm.py", family="rowwise")
EPS = 1e-5


def reference(x, w, b):
    return torch.nn.functional.layer_norm(x.double(), (x.shape[1],), w.double(), b.double(), EPS)


@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 100), (4, 1000), (2, 3000)])
def test_layernorm_matches_torch(kernel, rng, device, rows, cols):
    x = torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32) * 3 + 1).to(device)
    w = torch.from_numpy(rng.standard_normal(cols, dtype=np.float32)).to(device)
    b = torch.from_numpy(rng.standard_normal(cols, dtype=np.float32)).to(device)
    y = torch.empty_like(x)
    kernel.layernorm(x, w, b, y, rows, cols, EPS)
    assert_close(y.cpu().numpy(), reference(x, w, b).cpu().numpy(), rtol=1e-5)


def test_layernorm_speed(kernel, kope_bench, device):
    if device == "cpu":
        pytest.skip("Triton on CPU runs in the interpreter; its time means nothing")
    rows, cols = 4096, 4096
    x, w, b = (
        torch.randn(rows, cols, device=device),
        torch.randn(cols, device=device),
        torch.randn(cols, device=device),
    )
    y = torch.empty_like(x)
    kope_bench(kernel.layernorm, x, w, b, y, rows, cols, EPS)
