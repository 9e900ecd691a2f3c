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

from ..errors import ConfigError

__all__ = [
    "check_res_schedule",
    "check_sizes",
    "mean_step_cost",
    "parse_res_schedule",
    "resize_batch",
    "size_at",
    "step_cost",
]

Schedule = tuple[tuple[int, float], ...]
"""``((size, end fraction), ...)``: ``size`` px until ``end`` of the planned steps; the last end is 1."""


def parse_res_schedule(text: str, *, option: str = "--res-schedule") -> Schedule:
    """``"24:0.5,32:1.0"`` -> ``((24, 0.5), (32, 1.0))``: 24 px for the first half of the steps, then 32.
    Sizes are positive integers, the fractions increase and the last is 1."""
    out: list[tuple[int, float]] = []
    for part in str(text).split(","):
        size, sep, end = part.strip().partition(":")
        try:
            item = (int(size), float(end))
        except ValueError:
            item = None
        if not sep or item is None:
            raise ConfigError(f"{option}: expected SIZE:FRACTION[,SIZE:FRACTION...] (e.g. 24:0.5,32:1.0), got {text!r}")
        out.append(item)
    return check_res_schedule(out, option=option)


def check_res_schedule(schedule: object, *, option: str = "res_schedule") -> Schedule:
    """``schedule`` (pairs, e.g. from a saved recipe's JSON) as a validated tuple of ``(size, end)``."""
    try:
        pairs = tuple((int(s), float(e)) for s, e in schedule)  # type: ignore[union-attr, misc]
    except (TypeError, ValueError):
        raise ConfigError(f"{option}: expected pairs of (size, end fraction), got {schedule!r}") from None
    if not pairs:
        raise ConfigError(f"{option}: empty")
    prev = 0.0
    for size, end in pairs:
        if not 0 < size < 1 << 16:
            raise ConfigError(f"{option}: size {size} is out of range [1, 65536)")
        if not prev < end <= 1.0:
            raise ConfigError(f"{option}: the fractions must increase within (0, 1], got {end} after {prev}")
        prev = end
    if pairs[-1][1] != 1.0:
        raise ConfigError(f"{option}: the last fraction must be 1.0 (the end of training), got {pairs[-1][1]}")
    return pairs


def check_sizes(schedule: Schedule, *, final: tuple[int, int], multiple: int, dynamic_pad: bool = False) -> None:
    """Refuse a schedule whose last size is not the model's (evaluation) size ``final``, or with a size the
    patch size (times a hybrid's stride) ``multiple`` does not divide."""
    if (schedule[-1][0],) * 2 != tuple(final):
        raise ConfigError(
            f"--res-schedule: ends at {schedule[-1][0]} px but the model is built for {final[0]}x{final[1]}; "
            f"end the schedule at {final[0]} or pass --img-size {schedule[-1][0]}"
        )
    for size, _ in schedule:
        if size % multiple and not dynamic_pad:
            raise ConfigError(f"--res-schedule: {size} px is not divisible by the patch size {multiple}")


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
