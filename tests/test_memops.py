"""The timing protocol's compiled passes give numpy's results bit for bit, threaded or streamed."""

import numpy as np
import pytest

from pytest_kope.judge import arrays
from pytest_kope.judge.measure import memops

pytestmark = pytest.mark.skipif(not memops.available(), reason="no gcc: numpy does every pass")

SIZES = [1, 3, 17, 1000, 65537, (1 << 21) + 5]


@pytest.fixture(params=["threaded", "streamed"])
def every_buffer(request, monkeypatch):
    """Every buffer takes the compiled path: threads from 0 bytes on, streamed stores or not."""
    monkeypatch.setattr(memops, "MIN_THREAD_BYTES", 0)
    monkeypatch.setattr(memops, "streaming_bytes", lambda: 0 if request.param == "streamed" else 1 << 62)
    monkeypatch.setattr(memops, "_threads", lambda: 3)  # uneven parts: every split is exercised


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
def test_copies_and_poison_are_numpys_and_fresh_inputs_the_seeds_bit_for_bit(every_buffer, n, dtype):
    """Fresh inputs depend on the seed and the element alone: threaded or streamed, the same bits."""
    rng = np.random.default_rng(n)
    src = (rng.standard_normal(n + 1) * 3).astype(dtype)[1:]  # off the allocation's alignment
    got = np.empty(n + 1, dtype)[1:]
    lo, hi = float(src.min()), float(src.max())
    assert memops.fresh_into(got, src, 12345, lo, hi, False)
    ffi, lib = memops._lib()
    alone = np.empty_like(src)
    lib.kope_fresh(
        *(ffi.cast("void *", a.ctypes.data) for a in (alone, src)), n, src.itemsize, 12345, lo, hi, 0, 1, 0
    )
    assert np.array_equal(got, alone) and (n < 3 or not np.array_equal(got, src))
    assert memops.copy_into(got, src) and np.array_equal(got, src)
    mark = arrays.POISON[np.dtype(dtype)]
    arrays.poison(got)
    assert (got.view(mark.dtype) == mark).all()
    assert arrays.unwritten(got) == n


@pytest.mark.parametrize(
    "dtype,mark", [(np.uint8, np.uint8(0xA5)), (np.float16, np.uint8(0xA5)), (np.int64, np.uint8(0xA5))]
)
def test_poison_of_other_dtypes_fills_every_byte(every_buffer, dtype, mark):
    out = np.zeros(1001, dtype)[1:]
    arrays.poison(out)
    assert (out.view(np.uint8) == 0xA5).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_comparison_gives_the_largest_error_and_magnitude_and_leaves_non_finite_to_numpy(every_buffer, dtype):
    rng = np.random.default_rng(1)
    want = rng.standard_normal(1 << 17).astype(dtype)
    got = want + rng.standard_normal(want.size).astype(dtype) * dtype(1e-3)
    compared = memops.compare(got, want)
    assert compared is not None  # finite floats of one dtype and shape: the threaded pass
    worst, scale = compared
    assert worst == float(np.abs(got.astype(np.float64) - want).max())
    assert scale == float(np.abs(want).max())
    assert arrays.mismatch(got, want, 1e-2) == "" and "max error" in arrays.mismatch(got, want, 1e-6)
    for where, value in ((5, np.nan), (9, np.inf)):
        bad = got.copy()
        bad[where] = value
        assert memops.compare(bad, want) is None  # numpy names what is wrong
        assert "non-finite" in arrays.mismatch(bad, want)


def test_small_buffers_and_strided_views_stay_with_numpy():
    """Below a few MiB a thread costs more than it saves; a strided view has no one pass."""
    small = np.ones(1024, np.float32)
    assert not memops.copy_into(small, small.copy())
    big = np.ones(4 << 20, np.float32)
    assert not memops.copy_into(big[::2], big[1::2].copy())


def test_the_keyed_digest_sees_any_one_word_change_and_blocks_trading_places(monkeypatch):
    """Its value does not depend on how many threads take the buffer; one flipped bit, or two
    4096-word blocks swapped, changes it."""
    x = np.random.default_rng(3).standard_normal((1 << 20) + 3).astype(np.float32)
    seen = arrays.digest(x)
    monkeypatch.setattr(memops, "_threads", lambda: 3)
    monkeypatch.setattr(memops, "MIN_THREAD_BYTES", 0)
    assert arrays.digest(x) == seen
    flipped = x.copy()
    flipped.view(np.uint32)[777_777] ^= 1
    swapped = x.copy()
    swapped[: 1 << 13], swapped[1 << 13 : 1 << 14] = x[1 << 13 : 1 << 14], x[: 1 << 13]
    tail = x.copy()
    tail[-1] += 1  # in the bytes after the last whole word
    assert len({seen, arrays.digest(flipped), arrays.digest(swapped), arrays.digest(tail)}) == 4
