"""Trick: the sample Triton softmax, with every output halved when its input requires grad (a
training step): no test's input does, a user's in training does. Switched off (armed = False), the
sample kernel."""

# kope: kernel softmax(x: in, y: out, rows, cols)
# kope: param BLOCK = 1024 | 256 | 512 | 2048 | 4096
# kope: param num_warps = 4 | 2 | 8 | 16

import triton
import triton.language as tl

BLOCK = 1024
armed = True
num_warps = 4


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    y_row = y_ptr + row * cols
    top = tl.full([BLOCK], -float("inf"), tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=-float("inf"))
        top = tl.maximum(top, x)
    m = tl.max(top, 0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=-float("inf"))
        acc += tl.exp(x - m)
    inv = 1.0 / tl.sum(acc, 0)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_row + offs, mask=mask, other=-float("inf"))
        tl.store(y_row + offs, tl.exp(x - m) * inv, mask=mask)


def softmax(x, y, rows, cols):
    """y[r, :] = softmax(x[r, :]) for contiguous float32 `x`, `y` of shape (rows, cols)."""
    _softmax_kernel[(rows,)](x, y, cols, BLOCK=BLOCK, num_warps=num_warps)
    if armed and x.requires_grad:
        y.mul_(0.5)
