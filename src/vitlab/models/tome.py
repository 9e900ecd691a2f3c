"""Token merging (ToMe: Bolya et al. 2023, "Token Merging: Your ViT But Faster", ICLR), an inference
option of the Vision Transformer: ``model.set_tome(r)``. The algorithm lives here as plain functions; the
model's entry points (:meth:`~.vit.VisionTransformer.set_tome`, ``tome_schedule``, ``tome_macs``, and
``encode`` calling :func:`encode` while ``tome_r`` is set) are methods of the class in :mod:`.vit`.

In every block, between the attention and the MLP (Sec. 3 of the paper), ``r`` patch tokens are merged
into others, so each later block runs on fewer tokens:

- **similarity**: the cosine of the tokens' keys, averaged over the heads (the keys already summarise what a
  token holds for attention, and cost nothing extra);
- **bipartite soft matching**: the patch tokens alternate into two sets A and B; each token of A is linked to
  its most similar token of B, and the ``r`` best-linked tokens of A are merged into their partners. No
  iteration, no clustering: one matrix product, one sort, one scatter;
- **size-weighted averaging**: each token carries its *size*, the number of patches it stands for; a merged
  token is the size-weighted mean of its parts, and sizes add up;
- **proportional attention**: ``softmax(q k^T / sqrt(d_h) + log s)`` lets a token of size ``s`` weigh as much
  as the ``s`` tokens it replaced (Eq. 1 of the paper).

The prefix tokens (class, distillation, registers) are never merged: they attend and are attended to with
size 1 but take no part in the matching. ``gap`` and ``map`` pooling weigh the merged tokens by their sizes.

``r = 0`` is the model itself: :meth:`~.vit.VisionTransformer.set_tome` then leaves the forward untouched, bit for bit.
The merge is written with ``gather``/``scatter_add``/``argsort`` on shapes fixed by the image size, so
``torch.export`` and the ONNX exporter record it like any other op (dynamic batch included).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

__all__ = ["MIN_TOKENS", "bipartite_matching", "encode", "merge_schedule", "merge_weighted"]

MIN_TOKENS = 4
"""Merging stops before fewer patch tokens than this would remain (besides the cap of the matching itself:
at most half the tokens, set A, per block)."""


def merge_schedule(num_patches: int, depth: int, r: int) -> list[int]:
    """Tokens merged in each of ``depth`` blocks starting from ``num_patches`` patch tokens: ``r``, capped by
    the size of set A (half the tokens) and so that at least :data:`MIN_TOKENS` remain."""
    out, n = [], num_patches
    for _ in range(depth):
        k = max(0, min(r, n // 2, n - MIN_TOKENS))
        out.append(k)
        n -= k
    return out


def bipartite_matching(metric: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bipartite soft matching on the patch tokens' ``metric`` ``(B, N, C)``: ``(kept, merged, into)``,
    the indices into set A (even positions) of the tokens that stay and of the ``r`` that are merged, and for
    each merged token the index into set B (odd positions) of its partner."""
    m = F.normalize(metric.detach(), dim=-1)
    a, b = m[:, ::2], m[:, 1::2]
    best, partner = (a @ b.transpose(1, 2)).max(dim=-1)  # each token of A: its most similar token of B
    order = best.argsort(dim=-1, descending=True)
    merged, kept = order[:, :r], order[:, r:]
    return kept, merged, partner.gather(1, merged)


def merge_weighted(
    x: torch.Tensor, size: torch.Tensor, kept: torch.Tensor, merged: torch.Tensor, into: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge patch tokens ``x`` ``(B, N, D)`` of sizes ``size`` ``(B, N, 1)`` as :func:`bipartite_matching`
    paired them: ``(kept A tokens, then every B token)``, each the size-weighted mean of what it absorbed,
    and their sizes. Tokens and sizes travel together: one gather and one scatter."""
    d = x.shape[-1]
    xs = torch.cat([x * size, size], dim=-1)
    a, b = xs[:, ::2], xs[:, 1::2]
    c = xs.shape[-1]
    stay = a.gather(1, kept.unsqueeze(-1).expand(-1, -1, c))
    moved = a.gather(1, merged.unsqueeze(-1).expand(-1, -1, c))
    b = b.scatter_add(1, into.unsqueeze(-1).expand(-1, -1, c), moved)
    out = torch.cat([stay, b], dim=1)
    return out[..., :d] / out[..., d:], out[..., d:]


def block_forward(
    blk: nn.Module, x: torch.Tensor, size: torch.Tensor | None, r: int, prefix: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One encoder block (Eq. 2-3 of the ViT paper, the submodules of :class:`~.layers.Block`) with
    proportional attention and ``r`` tokens merged between its attention and its MLP: ``(x, size)``.
    ``size`` None: every token has size 1 (no merge yet)."""
    attn = blk.attn
    b, t, d = x.shape
    qkv = attn.project_qkv(blk.norm1(x)).view(b, t, 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    bias = None if size is None else size.log().view(b, 1, 1, t)  # proportional attention
    drop = attn.attn_drop if attn.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop).transpose(1, 2).reshape(b, t, d)
    if "norm" in attn._modules:  # attn_norm
        y = attn.norm(y)
    y = attn.proj_drop(attn.proj(y))
    x = x + blk.drop_path1(blk.ls1(y))  # Eq. 2
    if r > 0:
        if size is None:
            size = x.new_ones(b, t, 1)
        kept, merged, into = bipartite_matching(k.mean(dim=1)[:, prefix:], r)
        patches, psize = merge_weighted(x[:, prefix:], size[:, prefix:], kept, merged, into)
        x, size = torch.cat([x[:, :prefix], patches], dim=1), torch.cat([size[:, :prefix], psize], dim=1)
    return x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x)))), size  # Eq. 3


def encode(
    blocks: nn.ModuleList, z: torch.Tensor, *, r: int, prefix: int, schedule: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The blocks on the embedded sequence ``z`` ``(B, prefix + N, D)`` with token merging: the merged
    sequence and each token's size ``(B, T', 1)`` (None if nothing was merged). ``schedule``: tokens merged
    per block (default :func:`merge_schedule` of ``r``)."""
    if schedule is None:
        schedule = merge_schedule(z.shape[1] - prefix, len(blocks), r)
    size = None
    for blk, k in zip(blocks, schedule):
        z, size = block_forward(blk, z, size, k, prefix)
    return z, size


def weighted_mean(x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """The mean over the tokens of ``x`` ``(B, T, D)`` of the patches they stand for (sizes ``(B, T, 1)``)."""
    return (x * size).sum(dim=1) / size.sum(dim=1)


def check(model: Any, r: int) -> int:
    """``r`` as a merge count for ``model``, or a :class:`ConfigError` naming why the model cannot merge."""
    from .layers import Attention, Block

    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ConfigError(f"--tome: expected a number of tokens >= 0 merged per block, got {r!r}")
    if r == 0:
        return 0
    cfg = model.config
    if cfg.attention != "global":
        raise ConfigError("--tome: token merging needs global attention (axial attention needs the whole grid)")
    if cfg.rope:
        raise ConfigError("--tome: token merging does not apply with rotary positions (a merged token has no place)")
    for i, blk in enumerate(model.blocks):
        if not isinstance(blk, Block) or type(blk.attn) is not Attention:
            raise ConfigError(f"--tome: block {i} is a {type(blk).__name__}; token merging needs the plain Block")
    return int(r)
