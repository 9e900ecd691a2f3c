"""Axial-ViT (Appendix D.6).

"In Axial-ViT ... each Transformer block is replaced by an axial Transformer
block: self-attention along the rows of the patch grid followed by an MLP,
then self-attention along the columns followed by an MLP." Each half is an
ordinary pre-LN :class:`~vitlab.models.layers.Block` (``blocks.i.row``,
``blocks.i.col``), so attention cost falls from O(N^2) to O(N^1.5).

The class token (when present) takes part in every row and every column: it
is prepended to each row sequence (and to each column sequence), attends and
is attended to there, and its new state is the mean of its states over the
rows (columns). This keeps the token's role of Eq. 4 without a global layer.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import Block

__all__ = ["AxialBlock"]


class AxialBlock(nn.Module):
    """Row attention + MLP, then column attention + MLP, on a ``(B, prefix + gh*gw, D)`` sequence."""

    def __init__(self, **block_kwargs: object) -> None:
        super().__init__()
        self.row = Block(**block_kwargs)  # type: ignore[arg-type]
        self.col = Block(**block_kwargs)  # type: ignore[arg-type]

    def _axis(
        self, blk: nn.Module, cls: torch.Tensor | None, grid: torch.Tensor, return_attn: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Attend along the last spatial axis of ``grid`` ``(B, L, M, D)``: L sequences of length M."""
        b, lines, m, d = grid.shape
        seq = grid.reshape(b * lines, m, d)
        if cls is not None:
            seq = torch.cat([cls.repeat_interleave(lines, dim=0), seq], dim=1)
        attn = None
        if return_attn:
            seq, attn = blk(seq, return_attention=True)
        else:
            seq = blk(seq)
        if cls is not None:
            cls = seq[:, :1].reshape(b, lines, 1, d).mean(dim=1)
            seq = seq[:, 1:]
        return cls, seq.reshape(b, lines, m, d), attn

    def forward(
        self, x: torch.Tensor, *, grid: tuple[int, int], return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``(B, T, D)`` -> ``(B, T, D)``; with ``return_attention`` also the block's token mixing
        ``(B, heads, T, T)``: the column pass's weights composed with the row pass's."""
        b, t, d = x.shape
        gh, gw = grid
        prefix = t - gh * gw
        cls = x[:, :prefix] if prefix else None
        patches = x[:, prefix:].reshape(b, gh, gw, d)
        cls, patches, a_row = self._axis(self.row, cls, patches, return_attention)
        cls, cols, a_col = self._axis(self.col, cls, patches.transpose(1, 2), return_attention)
        out = cols.transpose(1, 2).reshape(b, gh * gw, d)
        if cls is not None:
            out = torch.cat([cls, out], dim=1)
        if not return_attention:
            return out
        assert a_row is not None and a_col is not None
        rows = _dense(a_row, b, grid, prefix, along_rows=True)
        cols_ = _dense(a_col, b, grid, prefix, along_rows=False)
        return out, cols_ @ rows  # token mixing of the whole block: column pass after row pass


def _dense(a: torch.Tensor, b: int, grid: tuple[int, int], prefix: int, *, along_rows: bool) -> torch.Tensor:
    """Scatter per-line attention ``(B*lines, H, prefix+M, prefix+M)`` into a ``(B, H, T, T)`` matrix.

    Row i of the result holds the weights with which token i's new state mixes
    the old states of all tokens, so the maps compose by matrix product.
    """
    gh, gw = grid
    lines, m = (gh, gw) if along_rows else (gw, gh)
    heads = a.shape[1]
    a = a.reshape(b, lines, heads, prefix + m, prefix + m).transpose(1, 2)
    t = prefix + gh * gw
    dense = a.new_zeros(b, heads, t, t)
    steps = torch.arange(m, device=a.device)
    for line in range(lines):
        idx = prefix + (line * gw + steps if along_rows else steps * gw + line)
        al = a[:, :, line]
        dense[:, :, idx[:, None], idx[None, :]] = al[:, :, prefix:, prefix:]
        if prefix:
            dense[:, :, idx, 0] = al[:, :, prefix:, 0]
            dense[:, :, 0, idx] += al[:, :, 0, prefix:] / lines
            dense[:, :, 0, 0] += al[:, :, 0, 0] / lines
    return dense
