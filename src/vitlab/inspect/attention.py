"""What the attention looks at: mean attention distance (Fig. 7 right, Appendix D.7)
and attention rollout (Fig. 6, Appendix D.8, after Abnar & Zuidema 2020).

All functions take the attention weights the model returns
(``model(x, return_attention=True)``): one tensor per layer of shape
``(B, heads, T, T)`` whose rows (queries) sum to one, with the
``num_prefix_tokens`` class token(s) first and the patches in row-major order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "attention_distance",
    "attention_rollout",
    "output_token_attention",
    "patch_centers",
    "patch_distance_matrix",
    "pixel_grid",
    "rollout_map",
    "uniform_attention_distance",
]


def patch_centers(grid: tuple[int, int], patch_size: int) -> torch.Tensor:
    """Pixel coordinates ``(row, col)`` of each patch centre, ``(gh * gw, 2)`` in row-major order."""
    gh, gw = grid
    r, c = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij")
    return torch.stack([r.flatten(), c.flatten()], dim=1) * patch_size + (patch_size - 1) / 2


def patch_distance_matrix(grid: tuple[int, int], patch_size: int) -> torch.Tensor:
    """Euclidean pixel distance between every pair of patch centres, ``(N, N)``."""
    centers = patch_centers(grid, patch_size)
    return torch.cdist(centers, centers)


def uniform_attention_distance(grid: tuple[int, int], patch_size: float) -> float:
    """The mean attention distance (pixels) of uniform attention over the patches: the mean pairwise distance
    of the grid's patch centres, the value a head that attends everywhere alike has (the "global" end of Fig. 7)."""
    return float(patch_distance_matrix(grid, patch_size).mean())


def pixel_grid(model: nn.Module, size: tuple[int, int]) -> tuple[tuple[int, int], float]:
    """The patch grid ``(rows, columns)`` ``model`` makes of an input of ``size`` (height, width) pixels,
    and the side of one grid cell in pixels. A hybrid's grid comes from its CNN stem (``patch_embed.grid``),
    so a cell spans the stem's whole downsampling, not the projection's patch size."""
    gh, gw = model.patch_embed.grid(*size)
    return (gh, gw), size[0] / gh


def _check(attn: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> None:
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (B, heads, T, T), got {tuple(attn.shape)}")
    t = num_prefix_tokens + grid[0] * grid[1]
    if attn.shape[-1] != t:
        raise ValueError(
            f"attention over {attn.shape[-1]} tokens does not match a {grid[0]}x{grid[1]} patch grid "
            f"with {num_prefix_tokens} prefix token(s)"
        )


def attention_distance(
    attns: Sequence[torch.Tensor] | torch.Tensor, *, grid: tuple[int, int], patch_size: int, num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Mean attention distance in pixels of every head at every layer, ``(layers, heads)``.

    Appendix D.7: "the average distance in image space across which information
    is integrated, based on the attention weights" -- for each query patch,
    the sum over key patches of attention weight x pixel distance between the
    two patch centres, averaged over query patches and over the batch.

    The class token has no position in the image, so it is left out both as a
    query and as a key, and each query's weights over the patch keys are
    renormalised to sum to one (weight spent on the class token would
    otherwise count as distance 0). Consequences: attention to self only gives
    0; uniform attention gives the mean pairwise distance of the patch grid.
    """
    if isinstance(attns, torch.Tensor):
        attns = [attns] if attns.ndim == 4 else list(attns)
    dist = patch_distance_matrix(grid, patch_size)
    p = num_prefix_tokens
    out = []
    for a in attns:
        _check(a, grid, p)
        w = a[:, :, p:, p:].double()
        w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-12)
        per_query = (w * dist.to(w.device)).sum(dim=-1)  # (B, heads, N)
        out.append(per_query.mean(dim=(0, 2)))
    return torch.stack(out).float().cpu()


def attention_rollout(
    attns: Sequence[torch.Tensor], *, residual: bool = True, head_fusion: str = "mean"
) -> torch.Tensor:
    """Joint attention from the last layer back to the input tokens, ``(B, T, T)``.

    Abnar & Zuidema (2020), as in Appendix D.8 of the paper: average the
    weights over heads, account for the residual connection by adding the
    identity and renormalising the rows (``0.5 A + 0.5 I``), then multiply the
    matrices of all layers, ``R = A_L ... A_2 A_1``. Row ``i`` of the result
    says how much each input token contributes to output token ``i``.
    ``head_fusion`` may also be ``"max"`` or ``"min"`` (common variants).
    """
    if not attns:
        raise ValueError("attention rollout needs the attention of at least one layer")
    result: torch.Tensor | None = None
    for a in attns:
        if a.ndim != 4:
            raise ValueError(f"expected attention of shape (B, heads, T, T), got {tuple(a.shape)}")
        a = a.double()
        if head_fusion == "mean":
            fused = a.mean(dim=1)
        elif head_fusion == "max":
            fused = a.amax(dim=1)
        elif head_fusion == "min":
            fused = a.amin(dim=1)
        else:
            raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
        if residual:
            fused = fused + torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
        fused = fused / fused.sum(dim=-1, keepdim=True)
        result = fused if result is None else fused @ result
    assert result is not None
    return result.float()


def _output_rows(m: torch.Tensor, num_prefix_tokens: int) -> torch.Tensor:
    """Row of the output token: the class token, or the mean over tokens without one (gap models)."""
    return m[:, 0] if num_prefix_tokens else m.mean(dim=1)


def rollout_map(
    attns: Sequence[torch.Tensor],
    *,
    grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    residual: bool = True,
    normalize: bool = True,
) -> torch.Tensor:
    """Fig. 6: how much each input patch reaches the output token, ``(B, gh, gw)``.

    The output token is the class token; for models without one (``gap``) it
    is the mean over all tokens, matching what the head sees. With
    ``normalize`` each map is scaled to a maximum of 1, ready to multiply
    the image with.
    """
    for a in attns:
        _check(a, grid, num_prefix_tokens)
    r = attention_rollout(attns, residual=residual)
    m = _output_rows(r, num_prefix_tokens)[:, num_prefix_tokens:]
    m = m.reshape(-1, *grid)
    if normalize:
        m = m / m.flatten(1).amax(dim=1).clamp_min(1e-12)[:, None, None]
    return m


def output_token_attention(
    attns: Sequence[torch.Tensor], *, grid: tuple[int, int], num_prefix_tokens: int = 1
) -> torch.Tensor:
    """Raw head-averaged attention of the output token to each patch, per layer: ``(layers, B, gh, gw)``.

    Without a class token the output token is the mean over the queries.
    Unlike the rollout, this ignores the residual path and the earlier layers.
    """
    maps = []
    for a in attns:
        _check(a, grid, num_prefix_tokens)
        fused = a.float().mean(dim=1)
        maps.append(_output_rows(fused, num_prefix_tokens)[:, num_prefix_tokens:].reshape(-1, *grid))
    return torch.stack(maps)
