"""Which of vitlab's CPU fast paths a benchmarked model ran, as a label for :class:`BenchResult`.

The one place in :mod:`vitlab.bench` that knows the fast paths (the fused oneDNN linears of
inference, the fused training blocks and their C kernels): everything else in the package asks
this module."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..models import Block, VisionTransformer, fused_block, onednn

__all__ = ["inference_path", "onednn_product", "training_path"]


def inference_path(model: nn.Module, x: torch.Tensor) -> str:
    """Which of vitlab's CPU inference paths an eval-mode forward of ``x`` takes."""
    with torch.inference_mode():
        fused = any(isinstance(b, Block) for b in model.modules()) and onednn.applies(model.eval(), x)
        size = model.inference_chunk_size(x) if isinstance(model, VisionTransformer) else x.shape[0]
    parts = ["oneDNN fused linears" if fused else "aten"]
    if size < x.shape[0]:
        parts.append(f"{-(-x.shape[0] // size)} chunks of <= {size}")
    return ", ".join(parts)


def training_path(model: nn.Module) -> str:
    """Which of vitlab's CPU training paths a training forward of ``model`` takes (fp32, eager)."""
    blocks = [b for b in model.modules() if isinstance(b, Block)]
    with torch.enable_grad():
        fused = bool(blocks) and all(
            fused_block.applies(b, torch.empty(1, 1, b.norm1.normalized_shape[0])) for b in blocks
        )
    if not fused:
        return "autograd"
    return "fused blocks, " + ("C kernels" if all(fused_block.uses_c_kernels(b) for b in blocks) else "ATen kernels")


def onednn_product(a: torch.Tensor, b: torch.Tensor) -> Callable[[], object] | None:
    """``a @ b`` as vitlab's inference path runs it (oneDNN's GEMM on ``b`` pre-packed), for
    :func:`matmul_peak`; None where that path does not exist (not a float32 CPU product, or no
    oneDNN in this torch build)."""
    if a.device.type != "cpu" or a.dtype != torch.float32 or not onednn.available():
        return None
    packed = onednn.pack(b)
    return lambda: onednn.packed_product(a, packed)
