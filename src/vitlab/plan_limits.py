"""The numbers ``vitlab plan`` (:func:`vitlab.capacity.plan`) takes: each size, memory, MFU and peak throughput
checked before any arithmetic, so that a typo is one line naming its flag instead of astronomical figures."""

from __future__ import annotations

import math

from ._units import format_size
from .errors import ConfigError

__all__ = ["LIMITS", "MAX_DEVICE_MEMORY", "MAX_PEAK_TFLOPS", "check_plan_numbers"]

LIMITS = {"--img-size": 16384, "--batch-size": 1 << 24, "--devices": 1 << 20, "--accum-steps": 1 << 20}
"""The largest value ``vitlab plan`` takes for each size: beyond any ViT training run (the paper's largest batch is
4096 at 224-518 px); a bigger number is a typo, and planning it would print astronomical figures."""
MAX_DEVICE_MEMORY = 1 << 50  # 1 PiB: no accelerator comes near it
MAX_PEAK_TFLOPS = 1e6  # 1 EFLOP/s per device: three orders of magnitude past an H100's dense bf16


def check_plan_numbers(
    *,
    img_size: int,
    batch_size: int,
    devices: int,
    device_memory: int,
    mfu: float,
    peak_tflops: float,
    accum_steps: int = 1,
) -> None:
    """One :class:`~vitlab.errors.ConfigError` naming the flag for a number no plan can take: a size under 1 or over
    :data:`LIMITS`, an MFU outside (0, 1], a peak throughput that is not a positive finite number (nan, inf)."""
    for flag, v in (
        ("--img-size", img_size),
        ("--batch-size", batch_size),
        ("--devices", devices),
        ("--accum-steps", accum_steps),
    ):
        if not 1 <= v <= LIMITS[flag]:
            raise ConfigError(f"{flag} {v}: must be from 1 to {LIMITS[flag]:,}")
    if not 1 <= device_memory <= MAX_DEVICE_MEMORY:
        raise ConfigError(f"--device-memory {format_size(device_memory)}: must be from 1 byte to 1 PiB")
    if not (math.isfinite(mfu) and 0 < mfu <= 1):
        raise ConfigError(f"--mfu {mfu}: must be in (0, 1], e.g. 0.4")
    if not (math.isfinite(peak_tflops) and 0 < peak_tflops <= MAX_PEAK_TFLOPS):
        raise ConfigError(
            f"--peak-tflops {peak_tflops}: must be a positive finite number of TFLOP/s, at most {MAX_PEAK_TFLOPS:g} "
            "(e.g. 312 for an A100)"
        )
