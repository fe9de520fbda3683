"""The problems the peer comparison times: inputs, the traffic each moves, and the peers that solve it.

One `Case` per known operator (the eight sample operators): it makes the inputs of the operator's
performance test (same shapes), says how many bytes a kernel must move at least (each input read once,
each output written once) or how many FLOPs it does, which roof bounds it (`copy` or `read` bandwidth,
or the `fma` peak), and builds the kernel-only peers a user would pick instead, each writing into the
one preallocated output buffer every contender shares: torch eager with `out=` (or its closest fused
call), `torch.compile` writing into that buffer, numpy (OpenBLAS for sgemm).

A case applies only to a kernel whose prototype it was written for (`matches`): an operator repo of
one's own with a kernel named `softmax` but another signature has no peers here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
Call = Callable[[], object]


@dataclass
class Problem:
    """One operator's inputs and output, shared by every contender, and what bounds its speed."""

    args: tuple[Any, ...]  # the kernel's arguments, in prototype order
    out: F32  # the output buffer every contender writes
    bytes_moved: int  # compulsory traffic: inputs read once, outputs written once
    flops: float  # 0 for memory-bound operators
    roof: str  # "copy", "read" (bandwidth) or "fma" (peak FLOP rate)
    peers: dict[str, Call] = field(default_factory=dict)  # eager and numpy peers
    compiled: dict[str, Call] = field(default_factory=dict)  # torch.compile peers (compile on first call)


@dataclass(frozen=True)
class Case:
    """One sample operator's perf-test shape and its kernel-only peers."""

    name: str
    prototype: str  # the C prototype this case was written for (whitespace-insensitive)
    make: Callable[[np.random.Generator, Any], Problem]  # (rng, torch or None) -> Problem
    rtol: float = 1e-3  # a peer's output against the committed kernel's, norm-wise

    def matches(self, kernels: tuple[str, ...]) -> bool:
        return _norm(self.prototype) in {_norm(k) for k in kernels}


def _norm(proto: str) -> str:
    return re.sub(r"\s+", " ", proto.replace("*", " * ")).strip()


def _compile(torch: Any, fn: Callable[..., object], *args: Any) -> Call:
    """torch.compile(fn) bound to the shared buffers; compiles on its first call (the warm-up)."""
    compiled = torch.compile(fn, dynamic=False)
    return lambda: compiled(*args)


ROWS = COLS = 4096
N = 16 * 1024 * 1024
GEMM = 1024


def _softmax(rng: np.random.Generator, torch: Any) -> Problem:
    x = (rng.standard_normal((ROWS, COLS), dtype=np.float32) * 4).astype(np.float32)
    y = np.empty_like(x)
    p = Problem((x, y, ROWS, COLS), y, 2 * x.nbytes, 0.0, "copy")
    if torch is not None:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        p.peers["torch eager"] = lambda: torch.ops.aten._softmax.out(xt, 1, False, out=yt)
        p.compiled["torch.compile"] = _compile(torch, lambda a, b: b.copy_(torch.softmax(a, 1)), xt, yt)
    return p


def _layernorm(rng: np.random.Generator, torch: Any) -> Problem:
    x = (rng.standard_normal((ROWS, COLS), dtype=np.float32) * 2 + 3).astype(np.float32)
    w = rng.standard_normal(COLS, dtype=np.float32)
    b = rng.standard_normal(COLS, dtype=np.float32)
    y = np.empty_like(x)
    p = Problem((x, w, b, y, ROWS, COLS), y, 2 * x.nbytes + w.nbytes + b.nbytes, 0.0, "copy")
    if torch is not None:
        xt, wt, bt, yt = (torch.from_numpy(a) for a in (x, w, b, y))
        mean, rstd = torch.empty(ROWS, 1), torch.empty(ROWS, 1)
        p.peers["torch eager"] = lambda: torch.ops.aten.native_layer_norm.out(
            xt, [COLS], wt, bt, 1e-5, out0=yt, out1=mean, out2=rstd
        )
        p.compiled["torch.compile"] = _compile(
            torch,
            lambda a, w_, b_, o: o.copy_(torch.nn.functional.layer_norm(a, (COLS,), w_, b_, 1e-5)),
            xt,
            wt,
            bt,
            yt,
        )
    return p


def _rmsnorm(rng: np.random.Generator, torch: Any) -> Problem:
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    w = rng.standard_normal(COLS, dtype=np.float32)
    y = np.empty_like(x)
    p = Problem((x, w, y, ROWS, COLS), y, 2 * x.nbytes + w.nbytes, 0.0, "copy")
    if torch is not None:
        xt, wt, yt = (torch.from_numpy(a) for a in (x, w, y))
        scale = torch.empty(ROWS, 1)

        def eager() -> object:
            # torch.rms_norm has no out= form (it allocates its output): the closest out= calls
            torch.linalg.vector_norm(xt, 2, dim=1, keepdim=True, out=scale)
            scale.mul_(scale).div_(COLS).add_(1e-6).rsqrt_()
            torch.mul(xt, scale, out=yt)
            return yt.mul_(wt)

        p.peers["torch eager"] = eager
        p.compiled["torch.compile"] = _compile(
            torch, lambda a, w_, o: o.copy_(torch.nn.functional.rms_norm(a, (COLS,), w_, 1e-6)), xt, wt, yt
        )
    return p


def _rowsum(rng: np.random.Generator, torch: Any) -> Problem:
    x = (rng.standard_normal((ROWS, COLS), dtype=np.float32) + 0.5).astype(np.float32)
    y = np.empty(ROWS, dtype=np.float32)
    p = Problem((x, y, ROWS, COLS), y, x.nbytes + y.nbytes, 0.0, "read")
    p.peers["numpy"] = lambda: np.sum(x, axis=1, out=y)
    if torch is not None:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        p.peers["torch eager"] = lambda: torch.sum(xt, 1, out=yt)
        p.compiled["torch.compile"] = _compile(torch, lambda a, o: o.copy_(a.sum(1)), xt, yt)
    return p


def _gelu(rng: np.random.Generator, torch: Any) -> Problem:
    x = (rng.standard_normal(N, dtype=np.float32) * 3).astype(np.float32)
    y = np.empty_like(x)
    p = Problem((x, y, N), y, 2 * x.nbytes, 0.0, "copy")
    if torch is not None:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        p.peers["torch eager"] = lambda: torch.ops.aten.gelu.out(xt, approximate="tanh", out=yt)
        p.compiled["torch.compile"] = _compile(
            torch, lambda a, o: o.copy_(torch.nn.functional.gelu(a, approximate="tanh")), xt, yt
        )
    return p


def _swiglu(rng: np.random.Generator, torch: Any) -> Problem:
    a = (rng.standard_normal(N, dtype=np.float32) * 4).astype(np.float32)
    b = rng.standard_normal(N, dtype=np.float32)
    y = np.empty_like(a)
    p = Problem((a, b, y, N), y, 3 * a.nbytes, 0.0, "copy")
    if torch is not None:
        at, bt, yt = (torch.from_numpy(v) for v in (a, b, y))
        # no fused silu-and-mul on the CPU: silu into the output, then multiply in place
        p.peers["torch eager"] = lambda: torch.ops.aten.silu.out(at, out=yt).mul_(bt)
        p.compiled["torch.compile"] = _compile(
            torch, lambda u, v, o: o.copy_(torch.nn.functional.silu(u) * v), at, bt, yt
        )
    return p


def _transpose(rng: np.random.Generator, torch: Any) -> Problem:
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    y = np.empty((COLS, ROWS), dtype=np.float32)
    p = Problem((x, y, ROWS, COLS), y, 2 * x.nbytes, 0.0, "copy")
    p.peers["numpy"] = lambda: np.copyto(y, x.T)
    if torch is not None:
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        p.peers["torch eager"] = lambda: yt.copy_(xt.t())
        p.compiled["torch.compile"] = _compile(torch, lambda a, o: o.copy_(a.t()), xt, yt)
    return p


def _sgemm(rng: np.random.Generator, torch: Any) -> Problem:
    a = rng.standard_normal((GEMM, GEMM), dtype=np.float32)
    b = rng.standard_normal((GEMM, GEMM), dtype=np.float32)
    c = np.empty((GEMM, GEMM), dtype=np.float32)
    p = Problem((a, b, c, GEMM, GEMM, GEMM), c, 3 * c.nbytes, 2.0 * GEMM**3, "fma")
    p.peers["numpy (OpenBLAS)"] = lambda: np.matmul(a, b, out=c)
    if torch is not None:
        at, bt, ct = (torch.from_numpy(v) for v in (a, b, c))
        p.peers["torch eager (mm)"] = lambda: torch.mm(at, bt, out=ct)
        # torch.compile lowers a lone mm to the same library call as eager: not a separate peer
    return p


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case("softmax", "void softmax(const float *x, float *y, int rows, int cols)", _softmax),
        Case(
            "layernorm",
            "void layernorm(const float *x, const float *w, const float *b, float *y, int rows, int cols)",
            _layernorm,
        ),
        Case(
            "rmsnorm", "void rmsnorm(const float *x, const float *w, float *y, int rows, int cols)", _rmsnorm
        ),
        Case("rowsum", "void rowsum(const float *x, float *y, int rows, int cols)", _rowsum),
        Case("gelu", "void gelu(const float *x, float *y, long n)", _gelu),
        Case("swiglu", "void swiglu(const float *a, const float *b, float *y, long n)", _swiglu),
        Case(
            "transpose", "void transpose(const float *x, float *y, int rows, int cols)", _transpose, rtol=0.0
        ),
        Case(
            "sgemm", "void sgemm(const float *A, const float *B, float *C, int M, int N, int K)", _sgemm, 1e-4
        ),
    )
}
