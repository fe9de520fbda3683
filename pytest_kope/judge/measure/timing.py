"""The measuring core of `kope_bench`: warm-up, calibrated rounds, rotated buffers, paired rounds.

Free of pytest so the same code runs in a plain test, in a judging child and in a benchmark.

Every block of calls starts from fresh inputs and poisoned outputs (`rotation.py`), and what timed
calls wrote is checked against the reference within the rounds (`outputcheck.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import arrays
from .outputcheck import Audit, InRoundCheck, timed_outputs_mismatch
from .rotation import IN, INOUT, OUT, SCALAR, Rotation, last_level_cache_bytes  # noqa: F401 - their old home
from .stats import PairedRatio, Stats

Call = Callable[..., object]


@dataclass(frozen=True)
class Budget:
    """How long a timing may take: rounds, calls per round, wall time."""

    warmup: int = 1  # calls before measuring (first-touch page faults, lazy binding, caches)
    min_round_s: float = 0.005  # calibrate calls per round so a round lasts at least this
    min_rounds: int = 5
    max_rounds: int = 50
    max_time_s: float = 1.0  # stop adding rounds after this much measuring
    look_every: int = 2  # paired: after min_rounds, ask every this many rounds whether the answer is known
    first_look: int = 0  # paired: the round of the first look, when earlier than min_rounds (`decided`)

    def looks_after(self, rounds: int) -> bool:
        """Whether paired rounds ask, after `rounds` of them, if the answer is known."""
        after_min = rounds >= self.min_rounds and (rounds - self.min_rounds) % self.look_every == 0
        return rounds == self.first_look or after_min


PLAIN = Budget()
# 6: the fewest rounds with a 95% bound; 4: the first look, for a candidate slower in every round.
# Rounds of 2 ms: a call that long is timed alone in its block (a 3 ms rowsum, timed two calls a block
# under the 5 ms of plain runs, prepared two 64 MiB copies per block: 55 ms a round around 12 ms of calls)
PAIRED = Budget(min_round_s=0.002, min_rounds=6, max_rounds=41, max_time_s=3.0, first_look=4)
Stop = Callable[[list[float], list[float]], bool]  # (reference, candidate) per-call times -> decided


def decided(min_gain: float) -> Stop:
    """A sequential test: stop once the 95% bound of the median ratio decides either way.

    Better: the bound's low end above 1 and the median above 1 + `min_gain` (the verdict's own rule).
    Not better: the bound's high end below 1 + `min_gain`, so no more rounds would make it a gain.
    Looked at after 6 rounds (the fewest for which a 95% bound of the median exists: all six agree),
    then every 2 (even counts keep the ABBA order balanced). Looking after every few rounds raises the
    chance of a false win above a single look's; the bench (`bench/overhead.py`) measures it on A/A
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
        return ratio.beats(min_gain) or ratio.high < 1.0 + min_gain

    return stop


def _run(
    fn: Call,
    sets: list[tuple[object, ...]],
    start: int,
    n: int,
    clock: Callable[[], float],
    sync: Callable[[], object],
) -> float:
    sync()
    t0 = clock()
    for i in range(n):
        fn(*sets[(start + i) % len(sets)])
    sync()
    return clock() - t0


def calibrate(
    fn: Call,
    rotation: Rotation,
    clock: Callable[[], float],
    sync: Callable[[], object],
    budget: Budget,
    lazy: bool = False,
    spent: list[float] | None = None,
) -> int:
    """Calls per round so a round lasts at least `min_round_s` (pytest-benchmark's idea).

    `lazy`: give a copy fresh inputs and poisoned outputs when a calibrating call first reaches a
    copy no one prepared yet, rather than all copies up front, so copies no call reaches stay
    untouched. A copy prepared before (by the guarded first call, or the other kernel's calibration)
    serves as it is: what calibrating calls write is never read, and they need only inputs the test
    could give (two re-preparations of a 64 MiB copy were a tenth of a timing's protocol). `spent`
    gets the seconds of each calibrating call block (the kernel's own time, without preparation).
    """
    sets, seeds = rotation.sets, rotation.seeds()

    def run(start: int, n: int) -> float:
        if lazy:
            rotation.prepare(seeds, [k for k in rotation.used(start, n) if k not in rotation.prepared])
        took = _run(fn, sets, start, n, clock, sync)
        if spent is not None:
            spent.append(took)
        return took

    took = 0.0
    for i in range(budget.warmup):
        took = run(i, 1)
    # One call is a round many times over, unless only the first was slow: a JIT compiled in it
    # (measured on an H200: a cold Triton reference timed one call a round, sync included, against a
    # warm candidate's 200 pipelined calls, and looked 2x slower than it was) or pages faulted in.
    slow = 20 * budget.min_round_s
    if budget.warmup and took >= slow and run(budget.warmup, 1) >= slow:
        return 1
    n = 1
    while True:
        took = run(0, n)
        if took >= budget.min_round_s or n >= 1 << 20:
            return n
        n = max(n * 2, math.ceil(n * budget.min_round_s / max(took, 1e-9)))


def measure(
    fn: Call,
    args: Sequence[object],
    clock: Callable[[], float],
    sync: Callable[[], object],
    budget: Budget = PLAIN,
    roles: Sequence[str] | None = None,
) -> Stats:
    """Time one kernel call: warm-up, calibrated rounds, the median per call."""
    rotation = Rotation(args, roles)
    rotation.prepare(rotation.seeds())
    n = calibrate(fn, rotation, clock, sync, budget)
    per_call, spent, r = [], 0.0, 0
    while r < budget.max_rounds and (r < budget.min_rounds or spent < budget.max_time_s):
        took = _run(fn, rotation.sets, r * n, n, clock, sync)
        per_call.append(took / n)
        spent += took
        r += 1
    return Stats.of(per_call, n)


@dataclass(frozen=True)
class KernelPair:
    """The kernels a paired timing compares, and the rtol within which their timed outputs must agree."""

    reference: Call
    candidate: Call
    rtol: float = arrays.DEFAULT_RTOL


@dataclass(frozen=True)
class CallArgs:
    """The arguments of the timed call, and their roles (IN, OUT, INOUT, SCALAR; None: arrays read only)."""

    values: Sequence[object]
    roles: Sequence[str] | None = None


@dataclass(frozen=True)
class Clock:
    """How a timing reads time: `now` in seconds, `sync` waits for queued device work (no-op on a CPU)."""

    now: Callable[[], float]
    sync: Callable[[], object]


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
    audits: int = 0  # audited candidate blocks (many calls a block; `outputcheck.Audit`)


def measure_paired(
    pair: KernelPair,
    args: CallArgs,
    clock: Clock,
    budget: Budget = PAIRED,
    stop: Stop | None = None,
    rotation: Rotation | None = None,
    between: Callable[[bool], None] = lambda candidate_ran: None,
) -> Paired:
    """Interleaved rounds in one window (ABBA order), so drift and bandwidth regimes hit both alike.

    Blocks start from fresh inputs and poisoned outputs, the same for both kernels in a round. `stop`
    ends rounds once the answer is known; `rotation`: copies of `args` the caller made; `between`,
    after each block, may end the timing by raising (a kernel that left process-wide state changed).
    """
    reference, candidate, now, sync = pair.reference, pair.candidate, clock.now, clock.sync
    rotation = rotation if rotation is not None else Rotation(args.values, args.roles)
    calibrating: list[float] = []
    n_ref, n_cand = _calibrate(pair, rotation, clock, budget, between, calibrating)
    ref: list[float] = []
    cand: list[float] = []
    spent, r, window = 0.0, 0, now()
    one_call = n_ref == n_cand == 1
    rotation.fit(max(n_ref, n_cand))  # every block prepares the copies it uses, right before its calls

    def block(fn: Call, start: int, n: int) -> float:
        took = _run(fn, rotation.sets, start, n, now, sync)
        between(fn is candidate)
        return took

    check, audit = _checks(rotation, one_call, pair, sync, budget, block)
    # the cap counts the whole window, fresh inputs included: an undecided pair ends at one wall time
    while r < budget.max_rounds and (r < budget.min_rounds or now() - window < budget.max_time_s):
        order = [(reference, n_ref, ref), (candidate, n_cand, cand)]
        seeds = rotation.seeds()  # both kernels see the same inputs in a round, new ones each round
        for j, (fn, n, out) in enumerate(order if r % 2 == 0 else reversed(order)):
            used = rotation.used(r * n, n)
            rotation.prepare(seeds, used)
            took = block(fn, r * n, n)
            out.append(took / n)
            spent += took
            if check is not None:  # one call a block: `used` is that call's one copy
                check.block(used[0], out is ref, first=j == 0)
        r += 1
        if audit is not None and audit.due(r):
            audit.run(r * n_cand, n_cand)  # where the candidate's next block would start
        if stop and budget.looks_after(r) and stop(ref, cand):
            break
    found = _mismatch(check, audit)
    return Paired(
        Stats.of(ref, n_ref),
        Stats.of(cand, n_cand),
        PairedRatio.of(ref, cand),
        found if found is not None else timed_outputs_mismatch(reference, candidate, rotation, pair.rtol),
        len(rotation.sets),
        rotation.bytes_per_call,
        sum(calibrating) + spent,
        audit.count if audit else 0,
    )


def _calibrate(
    pair: KernelPair,
    rotation: Rotation,
    clock: Clock,
    budget: Budget,
    between: Callable[[bool], None],
    spent: list[float],
) -> tuple[int, int]:
    """Calls a block of each kernel, the reference's first; the candidate's where no result of the
    reference is left."""
    n_ref = calibrate(pair.reference, rotation, clock.now, clock.sync, budget, lazy=True, spent=spent)
    rotation.wipe()
    between(False)
    n_cand = calibrate(pair.candidate, rotation, clock.now, clock.sync, budget, lazy=True, spent=spent)
    between(True)
    return n_ref, n_cand


def _checks(
    rotation: Rotation,
    one_call: bool,
    pair: KernelPair,
    sync: Callable[[], object],
    budget: Budget,
    block: Callable[[Call, int, int], float],
) -> tuple[InRoundCheck | None, Audit | None]:
    """The checks of timed outputs within the rounds. One call a block: both kernels write the same
    copy from the same inputs in a round, compared there, every round. Many calls a block: audits
    (`outputcheck.Audit`); parking their copies between timed blocks moved a 1.10x ratio to 1.04."""
    if one_call:
        return (InRoundCheck(rotation, pair.rtol) if rotation.outputs else None), None
    if not Audit.applies(rotation):
        return None, None
    earliest = min(budget.min_rounds, budget.first_look or budget.min_rounds)  # the sure audit before it
    return None, Audit(rotation, pair.reference, pair.candidate, pair.rtol, sync, earliest, block)


def _mismatch(check: InRoundCheck | None, audit: Audit | None) -> str | None:
    """What the checks within the rounds found ("": nothing), or None when they saw too little (a
    one-call timing that never wrote every copy, a many-call one never audited): check afterwards."""
    if check is not None and (check.mismatch or len(check.checked) == len(check.rotation.sets)):
        return check.mismatch
    if audit is not None and audit.count:
        return audit.mismatch
    return None
