"""Fresh timed inputs: the test's floating inputs, every element perturbed on its own.

A timed call never sees inputs a kernel could relate to inputs it saw before. Each preparation of a
rotation copy draws a 64-bit seed from the operating system, and element i of each floating input
becomes x_i * u_i, with u_i drawn for that element alone from [0.5, 1.5] (narrowed where needed so
that x_i * u_i stays in the input's own finite range). No copy is a scaled, offset or permuted
version of another, nor of the test's input: a kernel that samples a few elements to recognise
"an input seen before, transformed" finds none, so a cache of old answers serves nothing.

What the test's inputs promise a kernel is kept: dtype, shape, the finite range [min, max] (so the
domain a kernel handles: a positive input stays positive, one in [-1, 1] stays there), each
element's sign, which elements are zero, non-finite elements as given, and integer values (an input
of whole numbers is re-rounded, half away from zero, so no nonzero element becomes 0). Relations
between elements (sorted order, symmetry) are not kept. The seed alone decides the result, so an
audit restores a copy's inputs exactly (`outputcheck`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import memops

LOW, HIGH = 0.5, 1.5  # each element's factor is drawn from this range (narrowed to keep the range)
CHUNK = 1 << 20  # elements per step of the whole-numbers test: most inputs fail it in the first


@dataclass(frozen=True)
class Domain:
    """What of a floating input its fresh versions keep beyond each element's sign and zeros."""

    lo: float  # the smallest finite element (0.0 when there is none)
    hi: float  # the largest finite element
    integral: bool  # every finite element a whole number

    @classmethod
    def of(cls, pristine: Any) -> Domain:
        """The domain of `pristine`, an array or a tensor on its own device (read once per rotation)."""
        if isinstance(pristine, np.ndarray):
            return _numpy_domain(pristine)
        import torch

        x = pristine.detach()
        finite = x[torch.isfinite(x)]
        if finite.numel() == 0:
            return cls(0.0, 0.0, False)
        whole = bool(torch.equal(finite, torch.trunc(finite)))
        return cls(float(finite.min()), float(finite.max()), whole)


def fresh(target: Any, pristine: Any, seed: int | None, domain: Domain) -> None:
    """Write into `target` fresh inputs drawn from `pristine` with `seed` (None: `pristine` exactly,
    the test's own inputs), on the data's own device."""
    if seed is None:
        _copy(target, pristine)
    elif memops.fresh_into(target, pristine, seed, domain.lo, domain.hi, domain.integral):
        return  # float32/64 on the host: one threaded pass (`memops`)
    elif isinstance(target, np.ndarray):
        target[...] = _numpy_fresh(pristine, seed, domain)
    else:  # a torch tensor: seen on an H200, a host round trip per block made one timing take a minute
        _torch_fresh(target, pristine, seed, domain)


def _numpy_domain(x: np.ndarray) -> Domain:
    if x.size == 0:
        return Domain(0.0, 0.0, False)
    lo, hi = float(np.min(x)), float(np.max(x))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        finite = x[np.isfinite(x)]
        if finite.size == 0:
            return Domain(0.0, 0.0, False)
        lo, hi = float(finite.min()), float(finite.max())
    flat = x.reshape(-1)
    with np.errstate(invalid="ignore"):  # trunc(inf) is inf: whole, as it should be
        whole = all(
            np.array_equal(c, np.trunc(c), equal_nan=True)
            for c in (flat[k : k + CHUNK] for k in range(0, flat.size, CHUNK))
        )
    return Domain(lo, hi, whole)


def _numpy_fresh(pristine: np.ndarray, seed: int, domain: Domain) -> np.ndarray:
    """memops.c's FRESH in numpy (other random numbers, the same properties): for other dtypes,
    strided arrays, or no gcc."""
    work = np.float64 if pristine.dtype.itemsize > 4 else np.float32
    x = pristine.astype(work)
    r = np.random.Generator(np.random.Philox(seed)).random(x.shape, dtype=work)
    with np.errstate(all="ignore"):  # an input's NaN (even a signaling one) is the test's to give
        inv = 1 / np.where(x == 0, 1, x)
        a, b = domain.lo * inv, domain.hi * inv
        low = np.maximum(np.minimum(a, b), LOW)
        high = np.minimum(np.maximum(a, b), HIGH)
        y = x * (low + (high - low) * r)
        if domain.integral:
            y = np.trunc(y + np.copysign(0.5, y))
        np.clip(y, domain.lo, domain.hi, out=y)
        return np.where(np.isfinite(x), y, x).astype(pristine.dtype)


def _torch_fresh(target: Any, pristine: Any, seed: int, domain: Domain) -> None:
    import torch

    work = torch.float64 if pristine.dtype == torch.float64 else torch.float32
    x = pristine.to(work)
    generator = torch.Generator(device=x.device)
    generator.manual_seed(seed & ((1 << 63) - 1))
    r = torch.rand(x.shape, generator=generator, device=x.device, dtype=work)
    inv = 1 / torch.where(x == 0, torch.ones_like(x), x)
    a, b = domain.lo * inv, domain.hi * inv
    low = torch.clamp(torch.minimum(a, b), min=LOW)
    high = torch.clamp(torch.maximum(a, b), max=HIGH)
    y = x * (low + (high - low) * r)
    if domain.integral:
        y = torch.trunc(y + torch.copysign(torch.full_like(y, 0.5), y))
    y = torch.clamp(y, domain.lo, domain.hi)
    target.copy_(torch.where(torch.isfinite(x), y, x))


def _copy(target: Any, source: Any) -> None:
    if isinstance(target, np.ndarray):
        if not memops.copy_into(target, source):
            np.copyto(target, source)
    else:
        target.copy_(source)
