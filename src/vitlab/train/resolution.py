"""Progressive resolution (``vitlab train --res-schedule 24:0.5,32:1.0``): coarser images, so fewer
tokens, early in training and the full grid late.

A ViT takes any grid at run time: learned position embeddings are resampled to it on the fly
(:func:`vitlab.models.resample_posemb`, Sec. 3.2 of Dosovitskiy et al. 2021), so one model trains at
every size of the schedule. Training at a lower resolution than the test resolution is the FixRes effect
(Touvron et al. 2019); growing the resolution during training is the progressive resizing of
fast.ai's DAWNBench entries and the progressive learning of EfficientNetV2 (Tan & Le 2021). Evaluation
and the saved model use the final size."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .spec.kinds import Schedule, check_res_schedule
from .spec.options import parse_res_schedule
from .spec.rules import check_res_sizes as check_sizes

__all__ = [
    "check_res_schedule",
    "check_sizes",
    "mean_step_cost",
    "parse_res_schedule",
    "resize_batch",
    "size_at",
    "step_cost",
]


def size_at(schedule: Schedule, *, step: int, total_steps: int) -> int:
    """The image size for optimizer step ``step`` (0-based) of ``total_steps``."""
    frac = step / max(total_steps, 1)
    for size, end in schedule:
        if frac < end:
            return size
    return schedule[-1][0]


FIXED_COST = 0.25
"""The share of a full-size training step that does not shrink with the image (data, the optimizer, launch
overheads) in :func:`step_cost`'s model, set from the speedrun's 24 px and 32 px steps (docs/speedrun.md) and
erring towards fewer steps, so that a budgeted run ends on time."""


def step_cost(size: int, *, final: int) -> float:
    """The cost of a training step at ``size`` px relative to one at ``final`` px: the fixed share plus the rest
    in proportion to the pixels (the number of tokens)."""
    return FIXED_COST + (1 - FIXED_COST) * (size / final) ** 2


def mean_step_cost(schedule: Schedule) -> float:
    """The mean :func:`step_cost` over the planned steps of ``schedule``, relative to a step at its last size:
    what ``--time-budget`` multiplies a full-size step's time by to plan the run's length."""
    final, start, total = schedule[-1][0], 0.0, 0.0
    for size, end in schedule:
        total += (end - start) * step_cost(size, final=final)
        start = end
    return total


def resize_batch(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` ``(B, C, H, W)`` resized to ``size`` x ``size`` (bilinear, antialiased when shrinking); as is when
    it already has that size."""
    if x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
