"""Inputs with the structure users' inputs have, for drawn calls (`draws.py`).

Random values of one distribution are the easiest inputs a kernel ever meets. Users pass batches of
equal rows (padding, a repeated prompt), blocks of zeros or of one value, attention masks of -inf
(a row whose first block is masked whole is where an online softmax divides 0 by 0), NaN and +-inf
where a kernel is meant to pass them through or ignore them, and denormals. A drawn buffer takes one
of these structures over its random values; the drawn call is kept only where the committed kernel
stays finite on it (`draws.written_outputs`), so NaN and infinities are held against a candidate only
where the committed kernel absorbs them (a masked softmax row), never where it propagates them.
"""

from __future__ import annotations

import numpy as np

NONE = "none"
# what a buffer of each domain may take: no value outside its domain (no -inf in a positive input)
KINDS = {
    "any": (
        NONE,
        "equal rows",
        "zero block",
        "constant block",
        "-inf mask",
        "NaN",
        "+-inf",
        "denormal block",
    ),
    "nonneg": (NONE, "equal rows", "zero block", "constant block", "+inf", "denormal block"),
    "positive": (NONE, "equal rows", "constant block", "denormal block"),
}


def kinds(domain: str) -> tuple[str, ...]:
    """The structures a buffer of `domain` may take (none but NONE for integer-valued buffers)."""
    return KINDS.get(domain, (NONE,))


def apply(values: np.ndarray, row: int, kind: str, rng: np.random.Generator, tiny: float) -> None:
    """Give `values` (flat, float64, in place) the structure `kind`, in rows of `row` elements;
    `tiny` is the dtype's smallest normal number (denormals lie below it)."""
    n = values.size
    row = row if 0 < row <= n and n % row == 0 else n
    rows = values.reshape(-1, row)
    start, length = _block(n, rng)
    if kind == "equal rows":
        rows[1:] = rows[0]
    elif kind == "zero block":
        values[start : start + length] = 0.0
    elif kind == "constant block":
        values[start : start + length] = values[start]
    elif kind == "-inf mask" and row > 1:
        # a prefix of some rows masked: all but the last element (any block size is masked whole),
        # or a random length
        for r in np.flatnonzero(rng.random(rows.shape[0]) < 0.5) if rows.shape[0] > 1 else [0]:
            rows[r, : row - 1 if rng.random() < 0.5 else int(rng.integers(1, row))] = -np.inf
    elif kind == "NaN":
        values[rng.integers(0, n, max(1, n // 1000))] = np.nan
    elif kind in ("+-inf", "+inf"):
        signs = rng.choice([-1.0, 1.0], max(1, n // 1000)) if kind == "+-inf" else 1.0
        values[rng.integers(0, n, max(1, n // 1000))] = signs * np.inf
    elif kind == "denormal block":
        values[start : start + length] = np.sign(values[start : start + length]) * tiny * rng.random(length)


def given(x: np.ndarray, kind: str, domain: str) -> np.ndarray | None:
    """A recorded floating input with structure `kind` laid over it (rows: its last dimension), for
    a replay of a test's call; None where `domain` does not allow the kind. Deterministic, and a
    mask is laid where it shows most: every other row masked but for its last element."""
    if kind not in kinds(domain) or kind == NONE or x.dtype.kind != "f" or not x.size:
        return None
    values = x.astype(np.float64).reshape(-1)
    row = int(x.shape[-1]) if x.ndim > 1 else values.size
    if kind == "-inf mask":
        if row < 2:
            return None
        values.reshape(-1, row)[::2, :-1] = -np.inf
    else:
        apply(values, row, kind, np.random.default_rng(values.size), float(np.finfo(x.dtype).tiny))
    return values.astype(x.dtype).reshape(x.shape)


def _block(n: int, rng: np.random.Generator) -> tuple[int, int]:
    """A contiguous block of up to half the buffer (at least one element)."""
    length = int(rng.integers(1, max(2, n // 2 + 1)))
    return int(rng.integers(0, n - length + 1)), length
