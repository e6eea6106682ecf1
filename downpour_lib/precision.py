"""Mixed precision: ``torch.autocast`` for the forward pass, and for fp16 a dynamic loss scale.

bf16 has fp32's exponent range and needs no scale. fp16 does (its gradients underflow): the loss
is multiplied by a power of two S before backward, the gradients are divided by S before any
algorithm uses them, and a step whose gradients are not finite is skipped and S halved (doubled
again after ``growth_interval`` good steps), as ``torch.amp.GradScaler`` does.

What a distributed run adds is that the ranks that step together must skip together, or their
parameters part ways. ``AlgorithmOptions.overflow`` declares the agreement: by default one small
MAX allreduce of the finding over the ranks (the gossip methods, sync_ps with its servers); none
where every rank already sees the same gradients (allreduce and DDP, which average during backward: with a
power-of-two S, averaging scaled gradients and then unscaling gives exactly the unscaled average)
and none for the asynchronous methods (Downpour, AD-PSGD), where no rank steps with another and a
worker whose gradients overflowed just sends none that step. The scale is checkpointed with each
rank's state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's context: autocast to the precision's dtype, or nothing for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


class LossScaler:
    """A dynamic power-of-two loss scale, whose updates every rank that steps together makes alike
    (they are given the same agreed finding)."""

    def __init__(self, scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.scale, self.growth_interval = scale, growth_interval
        self.good_steps = 0
        self.skipped = 0  # steps skipped so far in this run

    def unscale_(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide every gradient by the scale in place; whether any is not finite (here)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return False
        found = torch.zeros(1, device=grads[0].device)
        inv = torch.full((1,), 1.0 / self.scale, device=grads[0].device)
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        for device, group in by_device.items():
            found_here = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, found_here, inv.to(device))
            found += found_here.to(found.device)
        return bool(found.item())

    def update(self, overflowed: bool) -> None:
        """After the step: halve on an overflow (the step was skipped), double after
        ``growth_interval`` good steps in a row."""
        if overflowed:
            self.scale = max(self.scale / 2, 1.0)
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= 2
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])
