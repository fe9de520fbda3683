"""The checks of what timed calls wrote: a kernel that skips work only when timed is caught by its
results, not only by its speed.

Both kernels of a pair make blocks of the same number of calls from the same start, each on copies
of its own (`rotation.py`) given the same fresh inputs in a round, so after a round each copy the
round used holds each kernel's result from the same inputs. `RoundCheck` compares them right after
the round, before either kernel runs again: copies drawn from the operating system's randomness
once both blocks are done (every copy of a one-call block), so no kernel can know which of its calls
will be looked at, and a kernel served by a kernel server cannot finish a block's work after its
answer, in a request that is not timed, before the check. Arguments that no fresh input restores
(in-place integers) cannot be compared within the rounds: those kernels are checked after them
(`timed_outputs_mismatch`).
"""

from __future__ import annotations

import random
from typing import Any

from .. import arrays
from .rotation import INOUT, OUT, Rotation, copy_into
from .sides import Clock, Side

CHECKED_PER_ROUND = 2  # copies compared after a round of many calls a block (all, for one call)


class RoundCheck:
    """The timed outputs check after every round (see the module's docstring)."""

    def __init__(self, reference: Rotation, candidate: Rotation, rtol: float):
        self.reference, self.candidate, self.rtol = reference, candidate, rtol
        self.checked: set[int] = set()
        self.mismatch = ""
        self._random = random.SystemRandom()

    @staticmethod
    def applies(rotation: Rotation) -> bool:
        """Whether fresh inputs restore every argument a kernel writes (else check after the rounds)."""
        return bool(rotation.outputs) and all(
            rotation.roles[i] == OUT or i in rotation.varied for i in rotation.outputs
        )

    def round(self, used: list[int]) -> None:
        """Compare copies of `used` (both kernels wrote them from the same inputs this round)."""
        if self.mismatch:
            return
        picked = used if len(used) <= CHECKED_PER_ROUND else self._random.sample(used, CHECKED_PER_ROUND)
        for k in picked:
            why = first_mismatch(self.candidate.outputs_of(k), self.reference.outputs_of(k), self.rtol)
            self.checked.add(k)
            if why:
                self.mismatch = f"on timed buffer copy {k + 1} of {len(self.candidate.sets)}, {why}"
                return


def timed_outputs_mismatch(reference: Side, candidate: Side, rtol: float, clock: Clock) -> str:
    """Run both kernels once more on every copy (the same fresh inputs each) and compare outputs."""
    mine, theirs = candidate.rotation, reference.rotation
    if not mine.outputs:
        return ""
    seeds = mine.seeds()
    mine.prepare(seeds)
    theirs.prepare(seeds)
    unrestored = [i for i in mine.outputs if mine.roles[i] == INOUT and i not in mine.varied]
    for k in range(len(mine.sets)):
        for i in unrestored:  # an in-place argument no fresh input restores: both start from the candidate's
            copy_into(theirs.sets[k][i], mine.sets[k][i])
        reference.repeat(k, 1, clock)
        candidate.repeat(k, 1, clock)
        why = first_mismatch(mine.outputs_of(k), theirs.outputs_of(k), rtol)
        if why:
            return f"on timed buffer copy {k + 1} of {len(mine.sets)}, {why}"
    return ""


def first_mismatch(got: dict[int, Any], want: dict[int, Any], rtol: float) -> str:
    """ "output #i: why" for the first output whose host values differ from the reference's, or ""."""
    for i, expected in want.items():
        found, wanted = arrays.host(got[i]), arrays.host(expected)
        why = arrays.mismatch(found, wanted, rtol) if found is not None and wanted is not None else ""
        if why:
            return f"output #{i}: {why}"
    return ""
