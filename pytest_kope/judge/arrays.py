"""Array helpers the judge shares, for numpy arrays and torch tensors alike (no pytest, no toolchain).

Poisoning and reading back outputs, digests of inputs, copies to and from the host, and the one
norm-wise comparison every check uses (guards, timed-output checks, the differential check).
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from .measure import memops

# NaNs with a payload no arithmetic produces (computed NaNs are canonical 0x7fc00000), so a legit NaN
# result is never mistaken for an unwritten element.
POISON = {np.dtype("float32"): np.uint32(0x7FA5A5A5), np.dtype("float64"): np.uint64(0x7FF4A5A5A5A5A5A5)}
# Candidate against the committed kernel on the same inputs, norm-wise. A safety net for what the tests
# do not reach (overflow, NaN, races, stale or cached results: errors of order 1), not a precision
# test: the repo's own tests judge precision. Seen: gelu's fast tanh, which its tests accept, differs
# from the committed erf form by 5.7e-3 on a one-element input, so 1e-3 rejected an honest winner.
DEFAULT_RTOL = 1e-2


def timed_rtol(marker: float | None, asserted: tuple[float, float] | None) -> tuple[float, str]:
    """The bar for timed outputs (candidate against the committed kernel) and where it came from: the
    marker's `rtol`; else the repo's own precision, from the committed kernel's run of its tests: the
    loosest norm-wise bound their `assert_close` calls set, plus the largest error they saw of the
    committed kernel (a candidate within the bound of the truth is within bound + that error of the
    committed kernel); else DEFAULT_RTOL. A looser bar would accept, where only the judge looks, a
    precision the tests reject where they look."""
    if marker is not None:
        return marker, "the marker's rtol"
    if asserted is not None:
        bound, error = asserted
        return (
            bound + error,
            f"the tests' assert_close bound {bound:.3g} + the committed kernel's error {error:.2g}",
        )
    return DEFAULT_RTOL, "the default: no rtol known (no marker `rtol=`, no assert_close in the tests)"


CHUNK = 1 << 16  # elements a comparison takes at a time: its temporaries stay in cache


def is_array(value: Any) -> bool:
    """Whether a kernel argument is an array (numpy or a device tensor), not a scalar."""
    return isinstance(value, np.ndarray) or hasattr(value, "detach")


def host(value: Any) -> np.ndarray | None:
    """A numpy view (or, for device tensors, a copy) of an array argument; None for a scalar."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch tensor
        t = value.detach()
        out: np.ndarray = t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
        return out
    return None


def host_copy(value: Any) -> np.ndarray | None:
    """A host copy of an array argument, or None for a scalar."""
    h = host(value)
    return None if h is None else np.array(h, copy=True)


def host_array(value: Any, copy: bool = False) -> np.ndarray:
    """`host` (`host_copy` with `copy`) of an argument that must be an array, as an output a kernel wrote."""
    h = host_copy(value) if copy else host(value)
    if h is None:
        raise TypeError(f"expected an array argument, got {type(value).__name__}")
    return h


def like(array: np.ndarray, template: Any) -> Any:
    """`array` as the same kind of object as `template` (a numpy array, or a torch tensor on its device)."""
    if isinstance(template, np.ndarray) or not hasattr(template, "detach"):
        return np.array(array, copy=True)
    import torch

    return torch.from_numpy(np.array(array, copy=True)).to(template.device)


def assign(target: Any, source: np.ndarray) -> None:
    """Copy host data into an array argument in place (numpy or torch)."""
    if isinstance(target, np.ndarray):
        target[...] = source
    else:
        import torch

        target.copy_(torch.from_numpy(np.ascontiguousarray(source)))


def poison(value: Any) -> None:
    """Fill an output with a pattern no correct kernel leaves behind (NaN for float tensors)."""
    if isinstance(value, np.ndarray):
        mark = POISON.get(value.dtype, np.uint8(0xA5))
        if not memops.fill(value, mark):  # a large buffer: threaded (`memops`)
            value.view(mark.dtype)[...] = mark
    elif hasattr(value, "fill_"):
        value.fill_(float("nan")) if value.is_floating_point() else value.fill_(-1)


def unwritten(value: Any) -> int:
    """How many elements still hold the poison (for torch: NaNs)."""
    h = host(value)
    if h is None:
        return 0
    if isinstance(value, np.ndarray):
        if h.dtype not in POISON:
            return 0
        bits, mark = np.ascontiguousarray(h).reshape(-1).view(POISON[h.dtype].dtype), POISON[h.dtype]
        hit = np.empty(min(bits.size, CHUNK), dtype=bool)  # in cache, not a 16 MiB mask per call
        missing = 0
        for start in range(0, bits.size, CHUNK):
            part = bits[start : start + CHUNK]
            missing += int(np.count_nonzero(np.equal(part, mark, out=hit[: part.size])))
        return missing
    return int(np.count_nonzero(np.isnan(h))) if h.dtype.kind == "f" else 0


def digest(value: Any) -> int:
    """A checksum of an array's bytes, to see whether it changed in place (same size, same process).

    A weighted sum of its 64-bit words, each word its own odd weight, drawn from the operating
    system once per process: any change of one word changes it for sure (an odd weight is
    invertible mod 2**64), any other almost surely, and no candidate can work out from our source
    which change of its inputs would keep it. Threaded in C where it can be (`memops`), else numpy.
    """
    h = host(value)
    if h is None:
        return 0
    data = np.ascontiguousarray(h).reshape(-1).view(np.uint8)
    whole = data.size // 8 * 8
    folded = zlib.crc32(data[whole:].tobytes()) ^ data.size
    fast = memops.digest(data[:whole])
    if fast is not None:
        return (folded * 0x100000001B3 + fast) & 0xFFFFFFFFFFFFFFFF
    words = data[:whole].view(np.uint64)
    scratch = np.empty(min(WORDS, words.size), np.uint64)
    for start in range(0, words.size, WORDS):
        chunk = words[start : start + WORDS]
        np.multiply(chunk, _WEIGHTS[: chunk.size], out=scratch[: chunk.size])
        folded = (folded * 0x100000001B3 + int(scratch[: chunk.size].sum())) & 0xFFFFFFFFFFFFFFFF
    return folded


WORDS = 1 << 15  # 256 KiB of words a chunk: the chunk, its weights and the products stay in cache
_WEIGHTS = np.random.default_rng(secrets.randbits(128)).integers(0, 1 << 63, WORDS, dtype=np.uint64) * 2 + 1


def rounding_floor(
    input_peak: float, read: int, written: int, dtype: np.dtype[Any], run: int = 1, output_peak: float = 0.0
) -> float:
    """The largest error that is only rounding (`differential.rounding_floor` says why): one ulp of
    the largest input, times the input elements over the output elements a call reads and writes.

    A `run` of equal input values is added up rounding the same way at every step, so along it the
    errors do not cancel: an accumulation over it can be off by up to one ulp per value of the run,
    relative to what it sums. A drawn row of 8,199 positive values, most of them one value, summed to
    374 sequentially and 0.0206 away in 16 lanes, 48 times the input-based floor. The sum may be
    hidden inside the call and every output scaled by it (a softmax's denominator, a norm's
    variance): the outputs then move relative to their peak, though each reads as one input (`terms`
    1): in one CI run an honest 16-lane softmax was 1.5e-4 of its peak from the sequential one on a
    row of 4,111 values holding a constant block. So the run alone bounds this part of the floor."""
    eps = float(np.finfo(dtype).eps)
    terms = max(1.0, read / written) if written else 1.0
    coherent = output_peak * eps * float(run) if run > 1 else 0.0
    return max(input_peak * eps * terms, coherent)


def peak(x: np.ndarray) -> float:
    """The largest finite magnitude of an array (0 when it holds none)."""
    finite = np.isfinite(x)
    return float(np.abs(x[finite]).max()) if finite.any() else 0.0


def equal_run(x: np.ndarray) -> int:
    """The longest run of consecutive equal, finite, nonzero values of a floating array (in memory
    order; 1 for none, 0 for an empty one)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    if x.dtype.kind != "f" or flat.size < 2:
        return int(flat.size > 0)
    same = (flat[1:] == flat[:-1]) & np.isfinite(flat[1:]) & (flat[1:] != 0)
    if not same.any():
        return 1
    edges = np.flatnonzero(np.diff(np.concatenate(([0], same.view(np.int8), [0]))))
    return int((edges[1::2] - edges[::2]).max()) + 1


def longest_run(xs: Iterable[np.ndarray]) -> int:
    """The longest `equal_run` among a call's inputs (1 when it has none): what widens its floor."""
    return max((equal_run(x) for x in xs), default=1)


def mismatch(got: np.ndarray, want: np.ndarray, rtol: float = DEFAULT_RTOL, atol: float = 0.0) -> str:
    """Why `got` does not match `want` norm-wise (largest error over the largest magnitude, plus an
    absolute floor `atol` for outputs whose magnitude says nothing, e.g. all zero), or "".

    Non-finite values must sit in the same places; where `want` is finite and `got` is not, that is
    named first, since it is the typical failure of an unsafe fast path (overflow, skipped max).
    """
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if got.dtype.kind not in "fc":
        bad = int(np.count_nonzero(got != want))
        return f"{bad} of {got.size} elements differ" if bad else ""
    found = memops.compare(got, want)  # all finite, float32 or float64: one threaded pass
    if found is not None:
        return _verdict(*found, rtol, atol)
    if got.dtype.kind == "f" and got.dtype.itemsize <= 4 and want.dtype == got.dtype:
        fast = _all_finite_mismatch(got, want, rtol, atol)
        if fast is not None:
            return fast
    with np.errstate(invalid="ignore"):  # the poison is a signalling NaN: converting it is fine here
        g, w = got.astype(np.float64), want.astype(np.float64)
    fin_g, fin_w = np.isfinite(g), np.isfinite(w)
    lost = int(np.count_nonzero(fin_w & ~fin_g))
    if lost:
        return f"{lost} of {got.size} elements are non-finite where the committed kernel's are finite"
    if not np.array_equal(fin_g, fin_w) or not np.array_equal(g[~fin_w], w[~fin_w], equal_nan=True):
        return "non-finite elements differ from the committed kernel's"
    if not fin_w.any():
        return ""
    scale = float(np.abs(w[fin_w]).max())
    worst = float(np.abs(g[fin_w] - w[fin_w]).max())
    return _verdict(worst, scale, rtol, atol)


def _verdict(worst: float, scale: float, rtol: float, atol: float) -> str:
    if worst > rtol * scale + atol + 1e-30:
        floor = f" + {atol:.3g}" if atol else ""
        return f"max error {worst:.3g} > {rtol:g} of max |expected| {scale:.3g}{floor}"
    return ""


def _all_finite_mismatch(got: np.ndarray, want: np.ndarray, rtol: float, atol: float = 0.0) -> str | None:
    """`mismatch` for the common case, both all finite, in float32 and in cache-sized chunks through
    one small buffer, instead of float64 copies and boolean-indexed ones (a 16M-element output:
    ~1 s -> ~0.012 s); None otherwise. A difference of two float32 values near each other is exact,
    so the verdict is the same."""
    if not want.size:
        return None
    g = got.astype(np.float32, copy=False).reshape(-1)
    w = want.astype(np.float32, copy=False).reshape(-1)
    worst, scale = 0.0, 0.0
    buffer = np.empty(min(g.size, CHUNK), dtype=np.float64 if g.size < 4096 else np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, g.size, CHUNK):
            gc, wc = g[start : start + CHUNK], w[start : start + CHUNK]
            d = np.subtract(gc, wc, out=buffer[: gc.size], dtype=buffer.dtype)
            # a NaN or inf in either array (or a difference that overflows) makes d's extremes
            # non-finite: five passes a chunk, not seven with min/max of `got` as well
            lo_d, hi_d = float(d.min()), float(d.max())
            if not (np.isfinite(lo_d) and np.isfinite(hi_d)):
                return None
            worst = max(worst, hi_d, -lo_d)
            scale = max(scale, float(wc.max()), -float(wc.min()))
    return _verdict(worst, scale, rtol, atol)


def scaled(value: np.ndarray, factor: float, offset: float = 0.0) -> np.ndarray:
    """A floating array times `factor` plus `offset` in its own dtype; other dtypes unchanged."""
    if value.dtype.kind != "f":
        same: np.ndarray = value.copy()
        return same
    out: np.ndarray = (value.astype(np.float64) * factor + offset).astype(value.dtype)
    return out


def kind(value: Any) -> str:
    """ "numpy", or "torch:<device>" for a tensor: enough to rebuild an argument from host data."""
    return f"torch:{value.device}" if hasattr(value, "detach") else "numpy"


def rebuild(array: np.ndarray, of_kind: str) -> Any:
    """A fresh argument of `of_kind` holding a copy of `array`."""
    if of_kind == "numpy":
        return np.array(array, copy=True)
    import torch

    return torch.from_numpy(np.array(array, copy=True)).to(of_kind.partition(":")[2])
