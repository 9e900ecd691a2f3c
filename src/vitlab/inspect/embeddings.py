"""What the embeddings learned: Fig. 7 left (principal components of the patch
embedding filters) and Fig. 7 centre (position-embedding similarity).

Sec. 4.5: "The components resemble plausible basis functions for a low-dimensional
representation of the fine structure within each patch", and "closer patches
tend to have more similar position embeddings ... patches in the same row/column
have similar embeddings".
"""

from __future__ import annotations

import torch
from torch import nn

from ..devices import model_device

__all__ = ["filter_pca", "patch_position_embeddings", "posemb_similarity"]


@torch.no_grad()
def filter_pca(weight: torch.Tensor, n_components: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of the patch-embedding filters ``E`` (``(D, C, P, P)``).

    Each of the D filters is one sample of dimension ``C * P * P``; the samples
    are centred and decomposed by SVD. Returns ``(components, explained)``:
    ``components`` is ``(k, C, P, P)`` (unit norm, sorted by variance, sign fixed so
    the entry of largest magnitude is positive, hence deterministic) and
    ``explained`` the fraction of the variance each one explains, ``(k,)``.
    ``k = min(n_components, D, C * P * P)``.
    """
    if weight.ndim != 4:
        raise ValueError(f"expected filters of shape (D, C, P, P), got {tuple(weight.shape)}")
    d = weight.shape[0]
    x = weight.detach().double().cpu().reshape(d, -1)
    x = x - x.mean(dim=0, keepdim=True)
    _, s, vh = torch.linalg.svd(x, full_matrices=False)
    var = s**2
    k = min(n_components, vh.shape[0])
    comps = vh[:k]
    idx = comps.abs().argmax(dim=1)
    sign = torch.sign(comps[torch.arange(k), idx])
    comps = comps * sign[:, None]
    explained = var[:k] / var.sum().clamp_min(1e-300)
    return comps.reshape(k, *weight.shape[1:]).float(), explained.float()


@torch.no_grad()
def patch_position_embeddings(model: nn.Module) -> torch.Tensor | None:
    """The position embedding of each patch at the model's native grid, ``(gh * gw, D)``.

    Learned 1-D: ``pos_embed`` without the class-token row; learned 2-D and
    sin-cos: the sum the model adds to each patch. ``None`` without position embeddings.
    """
    cfg = model.config
    if cfg.posemb == "none":
        return None
    if cfg.posemb == "learn":
        return model.pos_embed[0, cfg.num_prefix_tokens :].detach().float().cpu()
    ref = torch.zeros(1, dtype=torch.float32, device=model_device(model))
    pe = model._posemb_for(cfg.grid_size, ref)
    return None if pe is None else pe[0].detach().float().cpu()


@torch.no_grad()
def posemb_similarity(posemb: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Cosine similarity between the position embedding of each patch and all others.

    ``posemb`` is ``(gh * gw, D)`` in row-major order; returns ``(gh, gw, gh, gw)``
    where ``[r, c]`` is the similarity map of the patch in row ``r``, column ``c``.
    """
    gh, gw = grid
    if posemb.ndim != 2 or posemb.shape[0] != gh * gw:
        raise ValueError(f"expected ({gh * gw}, D) position embeddings for a {gh}x{gw} grid, got {tuple(posemb.shape)}")
    e = torch.nn.functional.normalize(posemb.double(), dim=1)
    return (e @ e.T).reshape(gh, gw, gh, gw).float()
