"""The checks of what timed calls wrote: a kernel that skips work only when timed is caught by its
results, not only by its speed.

One call a block (`InRoundCheck`): both kernels write the same rotation copy from the same fresh
inputs in a round, so their outputs are compared there, in every round. Many calls a block
(`Audit`): at unannounced points among the rounds, drawn from the operating system's randomness, an
extra candidate block that looks like any other until its last call (same start, same fresh inputs
and poisoned outputs, no pause) stops after a random number of calls; what each copy holds then is
compared with the reference's result from the same inputs, called as often. Neither perturbs a
timed block: an audit's own times are discarded. A kernel right only on calls after the rounds, or
on the last calls of a block, is named; checking only after the rounds (`timed_outputs_mismatch`,
kept for in-place arguments that are not floating, which no fresh input restores) saw neither.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import arrays
from .rotation import INOUT, OUT, Rotation, _blank, _clone

Call = Callable[..., object]
AUDIT_CHANCE = 0.25  # after the first `min_rounds`, the chance that a round is followed by an audit


class InRoundCheck:
    """The timed outputs check inside the rounds, for kernels timed one call a block.

    In a round both kernels run on the same rotation copy with the same fresh inputs, each after
    its outputs were poisoned; the first one's outputs are copied out (`Rotation.park`: to buffers
    no kernel is given) before the second block's poisoning, and compared with the second one's,
    which are then erased: the next round's second kernel is the other one, given this copy before.
    """

    def __init__(self, rotation: Rotation, rtol: float):
        self.rotation, self.rtol = rotation, rtol
        self.checked: set[int] = set()
        self.mismatch = ""
        self.first: tuple[bool, dict[int, np.ndarray | None]] = (True, {})

    def block(self, k: int, is_reference: bool, first: bool) -> None:
        # the first block's outputs are parked; the second block's are compared in place
        outputs = self.rotation.park(k) if first else self.rotation.outputs_of(k)
        if first:
            self.first = (is_reference, outputs)
            return
        was_reference, earlier = self.first
        want, got = (earlier, outputs) if was_reference else (outputs, earlier)
        why = first_mismatch(got, want, self.rtol)
        self.rotation.erase(k)
        if why and not self.mismatch:
            self.mismatch = f"on timed buffer copy {k + 1} of {len(self.rotation.sets)}, {why}"
        self.checked.add(k)


class Audit:
    """Audits of many-call candidate blocks (see the module's docstring)."""

    def __init__(
        self,
        rotation: Rotation,
        reference: Call,
        candidate: Call,
        rtol: float,
        sync: Callable[[], Any],
        min_rounds: int,
        block: Callable[[Call, int, int], float],
    ):
        self.rotation, self.reference, self.candidate = rotation, reference, candidate
        self.rtol, self.sync, self.min_rounds, self.block = rtol, sync, min_rounds, block
        self.mismatch = ""
        self.count = 0
        self._random = random.SystemRandom()  # where audits fall and how long their blocks are
        # the round the sure audit follows: one of 1..min_rounds - 1, so that timed rounds follow it
        # (a kernel that knows when the rounds may end cannot be right only after them)
        self.first = self._random.randint(1, max(1, min_rounds - 1))
        self._scratch: dict[int, Any] = {}

    @staticmethod
    def applies(rotation: Rotation) -> bool:
        """Whether fresh inputs restore every argument a kernel writes (else check after the rounds)."""
        return bool(rotation.outputs) and all(
            rotation.roles[i] == OUT or i in rotation.varied for i in rotation.outputs
        )

    def due(self, rounds_done: int) -> bool:
        """After round `rounds_done`: one audit surely within the first `min_rounds` (after round
        `first`), then after each round with chance AUDIT_CHANCE; none once one found a mismatch."""
        if self.mismatch:
            return False
        if rounds_done <= self.min_rounds:
            return rounds_done == self.first
        return self._random.random() < AUDIT_CHANCE

    def run(self, start: int, n: int) -> None:
        """A candidate block from call `start` that stops after 1..`n` calls, then its check."""
        rotation = self.rotation
        calls = self._random.randint(1, n)
        seeds = rotation.seeds()
        rotation.prepare(seeds, rotation.used(start, n))  # as for a whole block: no shorter pause
        self.block(self.candidate, start, calls)
        used = rotation.used(start, calls)
        self.count += 1
        times = Counter((start + i) % len(rotation.sets) for i in range(calls))
        for k in used:
            why = self._check(k, times[k], seeds[k])
            if why:
                self.mismatch = (
                    f"on timed buffer copy {k + 1} of {len(rotation.sets)}, {why} (an audited block)"
                )
                return

    def _check(self, k: int, times: int, seed: int | None) -> str:
        """Copy `k` after `times` candidate calls against the reference called as often on the same
        fresh inputs (restored: the candidate may have written them), into scratch outputs."""
        rotation = self.rotation
        values = list(rotation.sets[k])
        for i in rotation.outputs:
            values[i] = self._scratch.setdefault(i, _blank(values[i]))
            if rotation.roles[i] == OUT:
                arrays.poison(values[i])
        rotation.fresh_inputs(values, seed)  # in-place ones into their scratch
        for _ in range(times):
            self.reference(*values)
        self.sync()
        return first_mismatch(
            {i: rotation.sets[k][i] for i in rotation.outputs},
            {i: values[i] for i in rotation.outputs},
            self.rtol,
        )


def timed_outputs_mismatch(reference: Call, candidate: Call, rotation: Rotation, rtol: float) -> str:
    """Run both kernels once more on every rotation copy (fresh inputs each) and compare their outputs.

    The candidate writes the copy's own outputs, where it was timed; the reference writes the same
    results into scratch buffers (an in-out argument's scratch gets the copy's contents first), so
    nothing is copied out of the timed buffers and each copy is prepared once.
    """
    if not rotation.outputs:
        return ""
    rotation.prepare(rotation.seeds())
    scratch = {i: _clone(rotation.sets[0][i]) for i in rotation.outputs}
    for k, values in enumerate(rotation.sets):
        for i in rotation.outputs:
            if rotation.roles[i] == INOUT:
                _copy_into(scratch[i], values[i])
        reference(*(scratch.get(i, v) for i, v in enumerate(values)))
        candidate(*values)
        why = first_mismatch({i: values[i] for i in rotation.outputs}, scratch, rtol)
        if why:
            return f"on timed buffer copy {k + 1} of {len(rotation.sets)}, {why}"
    return ""


def first_mismatch(got: dict[int, Any], want: dict[int, Any], rtol: float) -> str:
    """ "output #i: why" for the first output whose host values differ from the reference's, or ""."""
    for i, expected in want.items():
        found, wanted = arrays.host(got[i]), arrays.host(expected)
        why = arrays.mismatch(found, wanted, rtol) if found is not None and wanted is not None else ""
        if why:
            return f"output #{i}: {why}"
    return ""


def _copy_into(target: Any, source: Any) -> None:
    if isinstance(target, np.ndarray):
        np.copyto(target, source)
    else:  # a torch tensor, on its own device
        target.copy_(source)
