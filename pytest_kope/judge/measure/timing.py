"""The measuring core of `kope_bench`: warm-up, calibrated rounds, rotated buffers, paired rounds.

Free of pytest so the same code runs in a plain test, in a judging child and in a benchmark.

Every block of calls starts from fresh inputs and poisoned outputs (`rotation.py`), and what timed
calls wrote is checked against the reference within the rounds (`outputcheck.py`). A kernel served
by a kernel server (`judge/kernel`) runs each timed block there in one request, on copies in its own
arena, and the clock brackets the request with the server's continue and stop: no moment of it runs
outside a reading, and the two kernels of a pair never share a process or a buffer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import arrays
from .outputcheck import RoundCheck, timed_outputs_mismatch
from .rotation import Rotation, touch_alike
from .sides import Budget as Budget
from .sides import CallArgs as CallArgs
from .sides import Clock as Clock
from .sides import Side as Side
from .stats import PairedRatio, Stats

Call = Callable[..., object]


PLAIN = Budget()
# 6: the fewest rounds with a 95% bound; 4: the first look, for a candidate slower in every round.
# Rounds of 2 ms: a call that long is timed alone in its block (a 3 ms rowsum, timed two calls a block
# under the 5 ms of plain runs, prepared two 64 MiB copies per block: 55 ms a round around 12 ms of calls)
PAIRED = Budget(min_round_s=0.002, min_rounds=6, max_rounds=41, max_time_s=3.0, first_look=4)
Stop = Callable[[list[float], list[float]], bool]  # (reference, candidate) per-call times -> decided


def decided(min_gain: float) -> Stop:
    """A sequential test: stop once the 95% bound of the median ratio decides either way.

    Better, early: the bound's low end above 1 + `min_gain`, the whole bound past the gain. At the cap
    the verdict's own rule decides (low end above 1, median above 1 + `min_gain`), so a marginal gain
    is judged on every round the cap allows. Rounds are not independent: they drift together for a
    while (a neighbour's burst), and six A/A rounds in a row each 3-17% faster for the same machine
    code passed the verdict's rule at the first look (a memory-bound rowsum, one pair in six); the
    stricter early bound waits such a stretch out, and a clear win still stops at once.
    Not better: the bound's high end below 1 + `min_gain`, so no more rounds would make it a gain.
    Looked at after 6 rounds (the fewest for which a 95% bound of the median exists: all six agree),
    then every 2 (even counts keep the ABBA order balanced). Looking after every few rounds raises the
    chance of a false win above a single look's; the bench (`bench/false_wins.py`) measures it on A/A
    pairs, a kernel against itself.
    Earlier, after 4 rounds, only one answer: not better, when the candidate was slower in every
    round. Were its median ratio 1 + `min_gain` or more, four slower rounds in four would happen with
    probability under 1/16 (a sign test), and far less unless rounds scatter by more than the gain;
    it can only lose a win, never make one, and most candidates of a search are plainly slower (a
    third fewer timed rounds for them).
    """

    def stop(reference: list[float], candidate: list[float]) -> bool:
        if len(reference) < 6:
            return all(r < c for r, c in zip(reference, candidate))
        ratio = PairedRatio.of(reference, candidate)
        return ratio.low > 1.0 + min_gain or ratio.high < 1.0 + min_gain

    return stop


def calibrate(
    side: Side,
    clock: Clock,
    budget: Budget,
    lazy: bool = False,
    spent: list[float] | None = None,
) -> int:
    """Calls per round so a round lasts at least `min_round_s` (pytest-benchmark's idea).

    `lazy`: give a copy fresh inputs and poisoned outputs when a calibrating call first reaches a
    copy no one prepared yet, rather than all copies up front, so copies no call reaches stay
    untouched. A copy prepared before (by the guarded first call) serves as it is: what calibrating
    calls write is never read. `spent` gets the seconds of each calibrating call block (the
    kernel's own time, without preparation).
    """
    rotation = side.rotation
    seeds = rotation.seeds()

    def run(start: int, n: int) -> float:
        if lazy:
            rotation.prepare(seeds, [k for k in rotation.used(start, n) if k not in rotation.prepared])
        took = side.run(start, n, clock)
        if spent is not None:
            spent.append(took)
        return took

    took = 0.0
    for i in range(budget.warmup):
        took = run(i, 1)
    # One call is a round many times over, unless only the first was slow: a JIT compiled in it
    # (measured on an H200: a cold Triton reference timed one call a round, sync included, against a
    # warm candidate's 200 pipelined calls, and looked 2x slower than it was) or pages faulted in.
    slow = 20 * side.min_round(budget)
    if budget.warmup and took >= slow and run(budget.warmup, 1) >= slow:
        return 1
    n = 1
    while True:
        took = run(0, n)
        if took >= side.min_round(budget) or n >= 1 << 20:
            return n
        n = max(n * 2, math.ceil(n * side.min_round(budget) / max(took, 1e-9)))


def measure(
    fn: Call,
    args: Sequence[object],
    clock: Callable[[], float],
    sync: Callable[[], object],
    budget: Budget = PLAIN,
    roles: Sequence[str] | None = None,
) -> Stats:
    """Time one kernel call: warm-up, calibrated rounds, the median per call."""
    side = Side.of(fn, CallArgs(args, roles))  # a served kernel times in its server (the plain check)
    side.rotation.prepare(side.rotation.seeds())
    timer = Clock(clock, sync)
    n = calibrate(side, timer, budget)
    per_call, spent, r = [], 0.0, 0
    while r < budget.max_rounds and (r < budget.min_rounds or spent < budget.max_time_s):
        took = side.run(r * n, n, timer)
        per_call.append(took / n)
        spent += took
        r += 1
    return Stats.of(per_call, n)


@dataclass(frozen=True)
class KernelPair:
    """The kernels a paired timing compares, and the rtol within which their timed outputs must agree.
    A kernel forwarded to a kernel server (`judge/kernel/remote.Forwarded`) is timed there."""

    reference: Call
    candidate: Call
    rtol: float = arrays.DEFAULT_RTOL


@dataclass(frozen=True)
class Paired:
    """Candidate and reference timed in interleaved rounds: the ratio and its bounds."""

    reference: Stats
    candidate: Stats
    ratio: PairedRatio
    mismatch: str  # why the candidate's timed outputs differ from the reference's; "" when they agree
    copies: int
    bytes_per_call: int
    kernel_s: float = 0.0  # wall time inside the timed windows (calibration included)
    checked: int = 0  # distinct copies whose timed outputs were compared within the rounds


def measure_paired(
    pair: KernelPair,
    args: CallArgs,
    clock: Clock,
    budget: Budget = PAIRED,
    stop: Stop | None = None,
    rotations: tuple[Rotation, Rotation] | None = None,
    between: Callable[[bool], None] = lambda candidate_ran: None,
) -> Paired:
    """Interleaved rounds in one window (ABBA order), so drift and bandwidth regimes hit both alike.

    Each kernel has copies of its own (`rotations`: reference's and candidate's, made by the caller;
    else made here); in a round both get the same fresh inputs and poisoned outputs, and what they
    wrote is compared after the round (`outputcheck`). `stop` ends rounds once the answer is known;
    `between(candidate)`, after the rounds, may end the timing by raising (a kernel that left its
    process's state changed).
    """
    reference, candidate = Side.of(pair.reference, args), Side.of(pair.candidate, args)
    if rotations is not None:
        reference.rotation, candidate.rotation = rotations
    touch_alike(reference.rotation, candidate.rotation)  # neither kernel's copies get the earlier pages
    calibrating: list[float] = []
    # both kernels make blocks of as many calls (the longer of the two calibrations), from the same
    # start: after a round the same copies hold both kernels' results from the same inputs
    n = max(
        calibrate(reference, clock, budget, lazy=True, spent=calibrating),
        calibrate(candidate, clock, budget, lazy=True, spent=calibrating),
    )
    # and no more calls a block than there are copies for: every call's output stays to be seen (a
    # kernel that works only on a block's last calls, whose copies later calls overwrite, is seen)
    n = min(n, candidate.rotation.capacity())
    for side in (reference, candidate):  # every block prepares the copies it uses, right before its calls
        side.rotation.fit(n)
    touch_alike(reference.rotation, candidate.rotation)  # the copies `fit` made, in turn
    check = (
        RoundCheck(reference.rotation, candidate.rotation, pair.rtol)
        if RoundCheck.applies(candidate.rotation)
        else None
    )
    ref, cand, spent = _rounds(reference, candidate, n, clock, budget, stop, check)
    found = check.mismatch if check is not None else None
    if found is None:
        found = timed_outputs_mismatch(reference, candidate, pair.rtol, clock)
    between(True)  # what the timed calls left changed in each kernel's process
    between(False)
    return Paired(
        Stats.of(ref, n),
        Stats.of(cand, n),
        PairedRatio.of(ref, cand),
        found,
        len(candidate.rotation.sets),
        candidate.rotation.bytes_per_call,
        sum(calibrating) + spent,
        len(check.checked) if check is not None else 0,
    )


def _rounds(
    reference: Side,
    candidate: Side,
    n: int,
    clock: Clock,
    budget: Budget,
    stop: Stop | None,
    check: RoundCheck | None,
) -> tuple[list[float], list[float], float]:
    """The interleaved rounds: each kernel's per-call times, and the seconds inside timed blocks. The
    cap counts the whole window, fresh inputs included: an undecided pair ends at one wall time."""
    ref: list[float] = []
    cand: list[float] = []
    spent, r, window = 0.0, 0, clock.now()
    while r < budget.max_rounds and (r < budget.min_rounds or clock.now() - window < budget.max_time_s):
        order = [(reference, ref), (candidate, cand)]
        seeds = candidate.rotation.seeds()  # both kernels see the same inputs in a round, new ones each round
        used = candidate.rotation.used(r * n, n)
        for side, out in order if r % 2 == 0 else reversed(order):
            side.rotation.prepare(seeds, used)
            took = side.run(r * n, n, clock)
            out.append(took / n)
            spent += took
        if check is not None:  # before either kernel runs again
            check.round(used)
        r += 1
        if stop and budget.looks_after(r) and stop(ref, cand):
            break
    return ref, cand, spent
