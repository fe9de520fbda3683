"""The torch modes a call is made in (grad, inference mode, autocast), carried from a test host to its
kernel server, which makes the call in them too.

A kernel a user calls runs in the user's process, under the modes the user set: a Python kernel can
read `torch.is_grad_enabled()` or `torch.is_autocast_enabled("cpu")`. A served kernel runs in a
process of its own, which would run every call in torch's defaults: a kernel wrong only under
autocast would then never be wrong where the judge looks. So a forwarded call sends the caller's
modes (`current`) and the server enters them around the call (`entered`). `requires_grad` travels
with each tensor (`remote._array`). Nothing is sent for the defaults, or where torch is not loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

AUTOCAST_DEVICES = ("cpu", "cuda")  # device types torch itself knows (others raise when asked)


def current() -> dict[str, Any] | None:
    """The caller's modes that differ from torch's defaults, or None (torch not loaded, defaults)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    modes: dict[str, Any] = {}
    if not torch.is_grad_enabled():
        modes["grad"] = False
    if torch.is_inference_mode_enabled():
        modes["inference"] = True
    autocast = [
        [device, str(torch.get_autocast_dtype(device)).removeprefix("torch.")]
        for device in AUTOCAST_DEVICES
        if torch.is_autocast_enabled(device)
    ]
    if autocast:
        modes["autocast"] = autocast
    return modes or None


@contextmanager
def entered(modes: dict[str, Any] | None) -> Iterator[None]:
    """`modes` (as `current` gave them) entered for the duration; nothing for None."""
    if not modes:
        yield
        return
    import torch

    with ExitStack() as stack:
        if modes.get("inference"):
            stack.enter_context(torch.inference_mode())
        elif "grad" in modes:
            stack.enter_context(torch.set_grad_enabled(bool(modes["grad"])))
        for device, dtype in modes.get("autocast", []):
            stack.enter_context(torch.autocast(str(device), dtype=getattr(torch, str(dtype))))
        yield
