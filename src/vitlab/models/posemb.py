"""Position embeddings (Sec. 3.1, Appendix D.4) and their resampling (Sec. 3.2).

Fine-tuning at a higher resolution keeps the patch size, so the patch grid
grows and "we perform 2D interpolation of the pre-trained position
embeddings, according to their location in the original image" (Sec. 3.2).

The resampling lives here as plain functions; loading a checkpoint trained at another resolution
(``load_state_dict`` resampling the stored position embeddings to the model's grid) is a method of
:class:`~.vit.VisionTransformer` (:meth:`~.vit.VisionTransformer.adapt_state_dict`), in :mod:`.vit`.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "ResampleMode",
    "grid_of",
    "patch_posemb_table",
    "resample_1d",
    "resample_posemb",
    "sincos_2d",
]

ResampleMode = Literal["jax", "bilinear", "bicubic", "bicubic-no-antialias"]


def sincos_2d(grid_h: int, grid_w: int, dim: int, *, temperature: float = 10000.0) -> torch.Tensor:
    """Fixed 2-D sine-cosine embedding, ``(grid_h * grid_w, dim)``.

    Same layout as big_vision's ``posemb_sincos_2d``: a quarter of the
    channels each for ``sin(x), cos(x), sin(y), cos(y)`` over geometric
    frequencies; patches in row-major order.
    """
    if dim % 4:
        raise ValueError(f"width {dim} must be divisible by 4 for the 2-D sin-cos position embedding")
    y, x = torch.meshgrid(
        torch.arange(grid_h, dtype=torch.float64), torch.arange(grid_w, dtype=torch.float64), indexing="ij"
    )
    q = dim // 4
    omega = torch.arange(q, dtype=torch.float64) / max(q - 1, 1)
    omega = 1.0 / temperature**omega
    y = y.flatten()[:, None] * omega[None, :]
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).float()


def grid_of(num_tokens: int) -> tuple[int, int]:
    """Square grid for ``num_tokens`` patches (checkpoints store no grid shape)."""
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(f"{num_tokens} position embeddings do not form a square grid; pass the grid explicitly")
    return side, side


def _interp(x: torch.Tensor, size: tuple[int, ...], mode: ResampleMode, antialias: bool) -> torch.Tensor:
    """Interpolate ``(1, C, *spatial)`` to ``size`` in float32."""
    dtype = x.dtype
    x = x.float()
    if mode == "bicubic-no-antialias":  # Hugging Face's DINOv2: bicubic, never antialiased, even when shrinking
        mode, antialias = "bicubic", False
    if mode == "jax":
        # scipy.ndimage.zoom(order=1) maps the first and last samples onto each
        # other, i.e. linear interpolation with corners aligned.
        m = "bilinear" if x.ndim == 4 else "linear"
        out = F.interpolate(x, size=size, mode=m, align_corners=True)
    elif mode == "bilinear":
        m = "bilinear" if x.ndim == 4 else "linear"
        out = F.interpolate(x, size=size, mode=m, align_corners=False, antialias=antialias and x.ndim == 4)
    elif mode == "bicubic":
        if x.ndim == 4:
            out = F.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=antialias)
        else:  # 1-D: bicubic along a single axis
            out = F.interpolate(
                x[..., None], size=(size[0], 1), mode="bicubic", align_corners=False, antialias=antialias
            )[..., 0]
    else:
        raise ValueError(f"unknown resample mode {mode!r}; choose 'jax', 'bilinear' or 'bicubic'")
    return out.to(dtype)


def resample_posemb(
    posemb: torch.Tensor,
    new_grid: tuple[int, int] | int,
    *,
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    mode: ResampleMode = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resample a learned 1-D position embedding to another patch grid.

    Args:
        posemb: ``(1, num_prefix_tokens + gh * gw, D)`` (or without the batch axis).
        new_grid: target grid ``(rows, cols)``; an int means square.
        old_grid: the grid ``posemb`` was trained on; inferred as square if omitted.
        num_prefix_tokens: leading rows (the class token's) copied unchanged.
        mode: ``"jax"`` matches the official code (``scipy.ndimage.zoom`` with
            ``order=1``: bilinear, corners aligned); ``"bicubic"`` matches timm
            and Hugging Face (corners not aligned, antialiased when shrinking in timm);
            ``"bicubic-no-antialias"`` is bicubic never antialiased (Hugging Face's ``Dinov2Model``,
            where its ``Dinov2WithRegistersModel`` antialiases); ``"bilinear"`` is bilinear without aligned corners.
        antialias: only for ``bilinear``/``bicubic``; timm uses True.

    Returns the embedding with ``num_prefix_tokens + rows * cols`` rows; the
    input is returned unchanged when the grid does not change.
    """
    squeeze = posemb.ndim == 2
    if squeeze:
        posemb = posemb[None]
    if isinstance(new_grid, int):
        new_grid = (new_grid, new_grid)
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    if old_grid is None:
        old_grid = grid_of(grid.shape[1])
    if old_grid[0] * old_grid[1] != grid.shape[1]:
        raise ValueError(f"old_grid {old_grid} does not match {grid.shape[1]} position embeddings")
    if tuple(old_grid) == tuple(new_grid):
        out = posemb
    else:
        d = grid.shape[-1]
        g = grid.reshape(1, old_grid[0], old_grid[1], d).permute(0, 3, 1, 2)
        g = _interp(g, tuple(new_grid), mode, antialias)
        g = g.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], d)
        out = torch.cat([prefix, g], dim=1)
    return out[0] if squeeze else out


def resample_1d(emb: torch.Tensor, length: int, *, mode: ResampleMode = "bicubic") -> torch.Tensor:
    """Resample a ``(1, L, D)`` axis embedding (the 2-D learned variant's rows or columns) to ``length``."""
    if emb.shape[1] == length:
        return emb
    x = emb.permute(0, 2, 1)
    return _interp(x, (length,), mode, antialias=False).permute(0, 2, 1)


def patch_posemb_table(
    like: torch.Tensor,
    grid: tuple[int, int],
    kind: str,
    trained_grid: tuple[int, int],
    mode: str,
    prefix: int,
    dim: int,
    *params: torch.Tensor,
) -> torch.Tensor:
    """E_pos for the patch tokens of a ``grid`` (``(1, N, D)``): the learned table resampled in 2-D
    when the grid differs from the trained one (Sec. 3.2), the row and column tables of the 2-D
    variant (Appendix D.4), or the fixed sine-cosine embedding (in ``like``'s dtype and device)."""
    if kind == "learn":
        pe = params[0][:, prefix:]
        if tuple(grid) != tuple(trained_grid):
            old = tuple(trained_grid)
            pe = resample_posemb(pe, grid, old_grid=old, num_prefix_tokens=0, mode=mode)  # type: ignore[arg-type]
        return pe
    if kind == "learn2d":
        gh, gw = grid
        rows = resample_1d(params[0], gh, mode=mode)[:, :, None, :].expand(-1, gh, gw, -1)  # type: ignore[arg-type]
        cols = resample_1d(params[1], gw, mode=mode)[:, None, :, :].expand(-1, gh, gw, -1)  # type: ignore[arg-type]
        return torch.cat([rows, cols], dim=-1).reshape(1, gh * gw, -1)
    # torch.compile traces through the cache (and warns); in a compiled graph the table is a constant anyway
    table = sincos_2d(grid[0], grid[1], dim)[None] if torch.compiler.is_compiling() else _sincos(grid[0], grid[1], dim)
    return table.to(device=like.device, dtype=like.dtype)


@functools.lru_cache(maxsize=16)
def _sincos(grid_h: int, grid_w: int, dim: int) -> torch.Tensor:
    return sincos_2d(grid_h, grid_w, dim)[None]
