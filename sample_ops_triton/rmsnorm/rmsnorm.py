"""RMS normalisation over the last axis in Triton: one program per row."""

# kope: kernel rmsnorm(x: in, w: in, y: out, rows, cols, eps)
# kope: param BLOCK = 1024 | 256 | 512 | 2048 | 4096
# kope: param num_warps = 4 | 2 | 8 | 16

import triton
import triton.language as tl

BLOCK = 1024
num_warps = 4


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    y_row = y_ptr + row * cols
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=0.0)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, 0) / cols + eps)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_row + offs, mask=mask, other=0.0)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        tl.store(y_row + offs, x * rstd * w, mask=mask)


def rmsnorm(x, w, y, rows, cols, eps):
    """y = x / sqrt(mean(x**2) + eps) * w per row of float32 (rows, cols) `x`; `w` is (cols,)."""
    _rmsnorm_kernel[(rows,)](x, w, y, cols, eps, BLOCK=BLOCK, num_warps=num_warps)
