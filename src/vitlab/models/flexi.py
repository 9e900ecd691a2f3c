"""FlexiViT's patch-size resizing (Beyer et al. 2023, "FlexiViT: One Model for All Patch Sizes", Sec. 3.4).

A patch embedding trained for P x P patches serves another patch size P' if its kernel ``w`` is
replaced by the ``w'`` that makes a resized patch give the same token: with ``B`` the linear map of
resizing a P x P patch to P' x P', ``<B x, w'> = <x, w>`` for every patch ``x`` means
``B^T w' = w``, solved in the least-squares sense by the pseudo-inverse, ``w' = pinv(B^T) w``
("PI-resize"). The position-embedding grid is resampled separately (:mod:`.posemb`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ConfigError

__all__ = ["resample_patch_embed"]


def resample_patch_embed(
    weight: torch.Tensor, new_patch: int | tuple[int, int], *, mode: str = "bicubic", antialias: bool = True
) -> torch.Tensor:
    """The patch projection ``weight`` ``(D, C, P, P)`` for ``new_patch`` x ``new_patch`` patches (PI-resize),
    with the resize of timm's ``resample_patch_embed`` (bicubic, antialiased), in float64 and back."""
    if weight.ndim != 4:
        raise ConfigError(f"patch_size: expected a (D, C, P, P) patch projection, got shape {tuple(weight.shape)}")
    new = (new_patch, new_patch) if isinstance(new_patch, int) else tuple(new_patch)
    old = tuple(weight.shape[-2:])
    if old == new:
        return weight
    n_old = old[0] * old[1]
    basis = torch.eye(n_old, dtype=torch.float64, device=weight.device).reshape(n_old, 1, *old)
    resize = F.interpolate(basis, size=new, mode=mode, antialias=antialias, align_corners=False)
    b = resize.reshape(n_old, -1).T  # (P'^2, P^2): patch x -> resized patch B x
    pinv = torch.linalg.pinv(b.T)  # (P'^2, P^2)
    d, c = weight.shape[:2]
    out = weight.reshape(d, c, n_old).to(torch.float64) @ pinv.T
    return out.reshape(d, c, *new).to(weight.dtype)
