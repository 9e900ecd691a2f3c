"""Learning-rate schedules: linear warmup, then cosine or linear decay (Appendix B.1), per optimizer step."""

from __future__ import annotations

import math

import torch

__all__ = ["build_scheduler", "lr_factor"]


def lr_factor(
    step: int, *, total_steps: int, warmup_steps: int, schedule: str = "cosine", min_ratio: float = 0.0
) -> float:
    """Multiplier of the peak LR at ``step`` (0-based): ``(step + 1) / warmup`` during warmup,
    then cosine / linear from 1 down to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * t)) if schedule == "cosine" else 1.0 - t
    return min_ratio + (1 - min_ratio) * shape


class _Factor:
    """A picklable-free callable; LambdaLR stores its ``__dict__`` (plain numbers) in ``state_dict``."""

    def __init__(self, *, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> None:
        self.total_steps, self.warmup_steps, self.schedule, self.min_ratio = (
            total_steps,
            warmup_steps,
            schedule,
            min_ratio,
        )

    def __call__(self, step: int) -> float:
        return lr_factor(
            step,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            schedule=self.schedule,
            min_ratio=self.min_ratio,
        )


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    total_steps: int,
    warmup_steps: int,
    schedule: str = "cosine",
    min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A :class:`~torch.optim.lr_scheduler.LambdaLR` stepped once per optimizer step."""
    f = _Factor(total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule, min_ratio=min_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)
