"""Timed inputs no kernel can predict, and parked results no kernel can reach (`freshinputs`, `rotation`).

Each preparation of a rotation copy perturbs every element of the test's floating inputs on its
own, with a seed from the operating system: what the test's inputs promise (dtype, shape, range,
signs, zeros, integer values, non-finite elements) is kept, and no copy is a scaled, offset or
permuted version of another. Kernels written in Python here play the tricks the judge must defeat:
recognising an earlier input, reading another copy's outputs.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from pytest_kope.judge.measure import memops, timing
from pytest_kope.judge.measure.freshinputs import Domain, fresh
from pytest_kope.judge.measure.rotation import Rotation, touch_alike


def _inputs(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    normal = (rng.standard_normal(n) * 3).astype(np.float32)
    normal[::17] = 0.0  # zeros where the test put them
    return {
        "normal": normal,
        "positive narrow": rng.uniform(1.0, 1.1, n).astype(np.float64),
        "in [-1, 1]": np.clip(rng.standard_normal(n), -1, 1).astype(np.float32),
        "whole numbers": rng.integers(-3, 4, n).astype(np.float32),
        "half": (rng.standard_normal(n) + 2).astype(np.float16),  # numpy's fallback
        "strided": (rng.standard_normal(2 * n) - 5).astype(np.float32)[::2],  # numpy's fallback
    }


SIZES = [1000, (1 << 21) + 3]  # one thread; threaded (above memops.MIN_THREAD_BYTES)


def _fresh(x: np.ndarray, seed: int) -> np.ndarray:
    out = np.empty_like(x)
    fresh(out, x, seed, Domain.of(x))
    return out


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", list(_inputs(8)))
def test_fresh_inputs_keep_what_the_tests_inputs_promise(kind, n):
    x = _inputs(n)[kind]
    y, again, other = _fresh(x, 11), _fresh(x, 11), _fresh(x, 12)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(y, again)  # the seed alone decides: an audit restores a copy exactly
    assert np.array_equal(y == 0, x == 0) and np.array_equal(np.signbit(y), np.signbit(x))
    assert x.min() <= y.min() and y.max() <= x.max()
    if kind == "whole numbers":
        assert np.array_equal(y, np.round(y))
    nonzero = x != 0
    # two preparations differ at every element but a handful (small whole numbers have few values
    # to take: 1 stays 1)
    same = np.mean(y[nonzero] == other[nonzero])
    assert same < (0.8 if kind == "whole numbers" else 0.01), same


def test_non_finite_elements_stay_as_the_test_gave_them():
    x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    x[[3, 5, 7]] = [np.nan, np.inf, -np.inf]
    y = _fresh(x, 99)
    assert np.isnan(y[3]) and y[5] == np.inf and y[7] == -np.inf
    finite = np.isfinite(x)
    assert np.isfinite(y[finite]).all() and x[finite].min() <= y[finite].min()


def _related(a: np.ndarray, b: np.ndarray) -> str:
    """How `b` follows from `a` by a scale and an offset, or by a permutation ("" when it does not):
    a least-squares fit b ~ s*a + t with its residual, and the sorted values."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    design = np.stack([a64, np.ones_like(a64)], axis=1)
    (s, t), *_ = np.linalg.lstsq(design, b64, rcond=None)
    residual = np.linalg.norm(b64 - (s * a64 + t)) / max(np.linalg.norm(b64 - b64.mean()), 1e-30)
    if residual < 0.05:
        return f"b = {s:.4f} a + {t:.4f} (relative residual {residual:.4f})"
    if np.allclose(np.sort(a64), np.sort(b64), rtol=1e-3, atol=1e-6):
        return "b is a permutation of a"
    return ""


@pytest.mark.parametrize("n", SIZES)
def test_no_copy_is_a_scaled_offset_or_permuted_version_of_another(n):
    """Across copies and rounds of a rotation, and against the test's own input: no linear fit
    explains one from another (old factors near 1 gave a residual of 0), nor does a permutation."""
    x = _inputs(n)["normal"]
    rotation = Rotation((x, np.empty_like(x)), ["in", "out"], max_copies=3)
    seen = [x.copy()]
    for _ in range(3):  # rounds
        rotation.prepare(rotation.seeds())
        for copy in rotation.sets:
            a = copy[0]
            assert isinstance(a, np.ndarray)
            seen.append(a.copy())
    for i, a in enumerate(seen):
        for b in seen[i + 1 :]:
            assert not _related(a, b)
    assert _related(x, x * np.float32(1.02) + np.float32(0.1))  # the fit does see a transform
    assert _related(x, x[::-1].copy())


def _double(x, y):
    np.multiply(x, 2, out=y)


class Recogniser:
    """A kernel with a cache keyed by structure: it samples a few elements and looks for an earlier
    input the sample is a scaled or offset version of (what a C kernel does with 8 loads). The same
    input again is no hit: calibrating calls repeat a copy as it is (their times decide only how
    many calls a block makes), and every timed block gets fresh inputs."""

    SAMPLE = np.array([1, 17, 333, 2048, 4000])

    def __init__(self):
        self.seen: list[np.ndarray] = []
        self.hits = 0

    def __call__(self, x, y):
        sample = x[self.SAMPLE].astype(np.float64)
        for old in self.seen:
            ratio, shift = sample / old, sample - old
            if np.array_equal(sample, old):
                continue
            if np.ptp(ratio) < 1e-6 * abs(ratio[0]) or np.ptp(shift) < 1e-6:
                self.hits += 1
        self.seen.append(sample)
        np.multiply(x, 2, out=y)


class Thief:
    """A kernel that remembers every output buffer it was given and, on each call, looks there for
    a finished result for its current inputs (the other kernel's, parked or left behind)."""

    def __init__(self):
        self.buffers: dict[int, np.ndarray] = {}
        self.found = 0

    def __call__(self, x, y):
        for buffer in self.buffers.values():
            if buffer is not y and np.array_equal(buffer[:64], 2 * x[:64]):
                self.found += 1
        self.buffers[id(y)] = y
        np.multiply(x, 2, out=y)


@pytest.mark.parametrize(
    "call_s", [0.0, 2.5e-4, 2e-5], ids=["one call a block", "a few calls a block", "many calls a block"]
)
def test_a_kernel_finds_neither_an_earlier_input_nor_the_other_kernels_result(call_s):
    """Paired rounds with the incumbent first and second by turns: the recogniser never finds an
    input related to one it saw, the thief never finds the incumbent's result for its inputs, in
    calibration, rounds, parking or audits. Each call of a block has its own copy, however many
    calls a block makes (a 20 us kernel makes 100 in a 2 ms round: more than the eight copies a
    rotation starts with)."""
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    budget = timing.Budget(min_rounds=10, max_rounds=10, max_time_s=30.0, min_round_s=4 * call_s)
    for trick in (Recogniser(), Thief()):
        paired = timing.measure_paired(
            timing.KernelPair(_taking(call_s, _double), _taking(call_s, trick)),
            timing.CallArgs((x, np.empty_like(x)), ["in", "out"]),
            timing.Clock(time.perf_counter, lambda: None),
            budget,
        )
        assert not paired.mismatch and paired.copies >= 2
        assert getattr(trick, "hits", 0) == 0 and getattr(trick, "found", 0) == 0


def _taking(seconds, kernel):
    """`kernel`, taking at least `seconds` a call (so that a round holds a few calls)."""

    def call(x, y):
        until = time.perf_counter() + seconds
        kernel(x, y)
        while time.perf_counter() < until:
            pass

    return call


@pytest.mark.skipif(not memops.available(), reason="no gcc: numpy prepares every input")
def test_a_threaded_preparation_is_the_same_as_one_thread(monkeypatch):
    x = _inputs((1 << 21) + 3)["normal"]
    threaded = _fresh(x, 5)
    monkeypatch.setattr(memops, "MIN_THREAD_BYTES", 1 << 62)
    assert np.array_equal(threaded, _fresh(x, 5))


def test_torch_tensors_get_fresh_inputs_on_their_own_device():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(_inputs(5000)["normal"])
    domain = Domain.of(x)
    y, other = torch.empty_like(x), torch.empty_like(x)
    fresh(y, x, 1, domain)
    fresh(other, x, 2, domain)
    assert torch.equal(y == 0, x == 0) and torch.equal(torch.signbit(y), torch.signbit(x))
    assert x.min() <= y.min() and y.max() <= x.max()
    assert not _related(x.numpy(), y.numpy()) and not _related(y.numpy(), other.numpy())


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_both_kernels_copies_are_faulted_in_together_before_either_kernel_runs():
    """Pages are handed out in the order they are first written, and where they lie changes a
    memory-bound kernel's speed: measured, the kernel whose copies were written later was 5-15%
    faster in every round. `touch_alike` writes both rotations' pages in turn, contents unchanged."""
    import mmap

    def allocate(template: np.ndarray) -> np.ndarray:  # memory no one has written yet: not resident
        return np.frombuffer(mmap.mmap(-1, template.nbytes), template.dtype).reshape(template.shape)

    rng = np.random.default_rng(3)
    x = rng.standard_normal(1 << 21).astype(np.float32)  # 8 MiB, fresh in every copy
    index = rng.integers(0, 1 << 21, 1 << 21).astype(np.int32)  # 8 MiB, cloned: the test's values
    args, roles = [x, index, np.empty_like(x)], ["in", "in", "out"]
    a, b = (Rotation(args, roles, allocate=allocate) for _ in range(2))
    before = _resident_bytes()
    touch_alike(a, b)
    grew = _resident_bytes() - before
    copies = len(a.sets) + len(b.sets)
    assert grew >= 0.9 * copies * 2 * x.nbytes, (grew, copies)  # the blank ones (clones were written)
    assert a.touched == set(range(len(a.sets))) and b.touched == set(range(len(b.sets)))
    for r in (a, b):
        for copy in r.sets:
            assert np.array_equal(np.asarray(copy[1]), index)  # contents unchanged
    again = _resident_bytes()
    touch_alike(a, b)  # touched copies are left alone
    assert _resident_bytes() - again < x.nbytes
