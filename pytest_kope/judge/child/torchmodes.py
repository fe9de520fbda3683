"""How users call a torch kernel beyond torch's defaults: under `no_grad` or `inference_mode`, on
inputs that require grad (a training step), under `torch.autocast`. A Python kernel can read each of
these (`x.requires_grad`, `torch.is_autocast_enabled("cpu")`) and be right only where the judge
calls it; so the differential check also calls it so (each test call once more on inputs that
require grad and once under autocast, and the drawn calls in turn in every mode), with the committed
kernel, called the same way, as the oracle: a mode the committed kernel fails in is not held against
a candidate. The modes reach a kernel server with each call (`judge/kernel/callmodes.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

MODES = ("default", "no_grad", "inference_mode", "requires_grad", "autocast")
# each recorded call of a torch kernel is also replayed in these (name, mode), beside the transforms
TRANSFORMS = (
    ("as tested, inputs requiring grad", "requires_grad"),
    ("as tested, under torch.autocast", "autocast"),
)


def is_torch(kinds: Mapping[Any, str]) -> bool:
    """Whether a call's arrays are torch tensors (`arrays.kind`)."""
    return any(str(k).startswith("torch") for k in kinds.values())


@contextlib.contextmanager
def entered(mode: str | None, values: tuple[Any, ...] = ()) -> Iterator[None]:
    """The torch context of `mode` for a call on `values` (autocast on their device); nothing for the
    default, for `requires_grad` (a property of the inputs: `prepared`), or without torch."""
    if mode in ("no_grad", "inference_mode"):
        import torch

        with getattr(torch, mode)():
            yield
    elif mode == "autocast":
        import torch

        device = next((v.device.type for v in values if hasattr(v, "device")), "cpu")
        with torch.autocast(device_type=device):
            yield
    else:
        yield


def prepared(values: tuple[Any, ...], inputs: list[int], mode: str | None) -> tuple[Any, ...]:
    """`values` with the floating tensors among `inputs` requiring grad, for `requires_grad`."""
    if mode != "requires_grad":
        return values
    for i in inputs:
        v = values[i]
        if hasattr(v, "requires_grad_") and v.is_floating_point():
            v.requires_grad_(True)
    return values
