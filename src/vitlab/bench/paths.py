"""Which of vitlab's CPU fast paths a benchmarked model ran, as a label for :class:`BenchResult`:
the words come from :mod:`vitlab.accel`, the one place that knows the paths."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..accel import inference_path, onednn, training_path

__all__ = ["inference_path", "onednn_product", "training_path"]


def onednn_product(a: torch.Tensor, b: torch.Tensor) -> Callable[[], object] | None:
    """``a @ b`` as vitlab's inference path runs it (oneDNN's GEMM on ``b`` pre-packed), for
    :func:`matmul_peak`; None where that path does not exist (not a float32 CPU product, or no
    oneDNN in this torch build)."""
    if a.device.type != "cpu" or a.dtype != torch.float32 or not onednn.available():
        return None
    packed = onednn.pack(b)
    return lambda: onednn.packed_product(a, packed)
