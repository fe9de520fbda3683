"""Held out for the Ascend lowering check (gelu's interface): the same kernel under @triton.autotune."""

# kope: kernel gelu(x: in, y: out, n)
# kope: param BLOCK = 1024
import triton
import triton.language as tl

BLOCK = 1024


@triton.autotune(
    configs=[triton.Config({"BLOCK": 1024})], key=["n"], do_bench=lambda call, quantiles: [1.0, 1.0, 1.0]
)
@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(tl.where(mask, x_ptr + offs, x_ptr), mask=mask, other=0.0)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    e = tl.exp(-2.0 * tl.abs(inner))
    t = tl.where(inner >= 0, (1 - e) / (1 + e), (e - 1) / (1 + e))
    tl.store(y_ptr + offs, 0.5 * x * (1 + t), mask=mask)


def gelu(x, y, n):
    _gelu_kernel[(triton.cdiv(n, 1024),)](x, y, n)
