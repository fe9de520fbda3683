"""GELU, tanh approximation, elementwise in Triton over a flat float32 buffer."""

# kope: kernel gelu(x: in, y: out, n)
# kope: param BLOCK = 1024 | 256 | 512 | 2048 | 4096
# kope: param num_warps = 4 | 2 | 8

import triton
import triton.language as tl

BLOCK = 1024
num_warps = 4


@triton.jit
def _gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    # 0.5 * x * (1 + tanh(u)) = x * sigmoid(2u); with z = exp(-2|u|) in (0, 1] nothing overflows
    z = tl.exp(-2.0 * tl.abs(u))
    sig = tl.where(u >= 0, 1.0 / (1.0 + z), z / (1.0 + z))
    tl.store(y_ptr + offs, x * sig, mask=mask)


def gelu(x, y, n):
    """y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) for `n` contiguous float32 values."""
    _gelu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK, num_warps=num_warps)
