"""Optimisers with parameter groups: no weight decay on norms, biases, position embeddings
and the class token (``model.no_weight_decay()``), as in timm and big_vision."""

from __future__ import annotations

import torch
from torch import nn

from .recipes import Recipe

__all__ = ["build_optimizer", "param_groups"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed matrices, and 1-D tensors / ``no_weight_decay()`` names without decay."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name in skip or name.endswith(".bias"):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, recipe: Recipe, lr: float) -> torch.optim.Optimizer:
    """``adamw`` / ``adam`` (decoupled weight decay, i.e. AdamW, in both: the paper's "Adam with
    weight decay" scales the decay by the learning rate) or ``sgd`` with momentum."""
    groups = param_groups(model, recipe.weight_decay)
    if recipe.optimizer in ("adamw", "adam"):
        return torch.optim.AdamW(
            groups, lr=lr, betas=recipe.betas, weight_decay=recipe.weight_decay, fused=_fused_ok(model)
        )
    return torch.optim.SGD(groups, lr=lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


def _fused_ok(model: nn.Module) -> bool | None:
    """The single-kernel (fused) AdamW when every parameter can use it (CPU/CUDA floats): one pass over all
    parameters instead of torch's default per-tensor loops, whose overhead dominates a small model's step
    (docs/performance.md)."""
    ps = list(model.parameters())
    ok = ps and all(
        p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in ps
    )
    return True if ok else None
