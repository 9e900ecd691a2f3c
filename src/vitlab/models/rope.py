"""2-D rotary position embeddings (RoPE) for the patch tokens, as EVA-02 and DINOv3 use them.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding") rotates each
pair of query and key channels by an angle proportional to the token's position, so that the dot
product ``q_m . k_n`` depends on the positions only through ``m - n``. The 2-D axial form (Fang et
al. 2023, "EVA-02: A Visual Representation for Neon Genesis", Sec. 2; Heo et al. 2024, "Rotary
Position Embedding for Vision Transformer"; Simeoni et al. 2025, DINOv3) gives the first half of each
head's channels the patch's row and the second half its column: within a half of ``h`` channels,
pair ``i`` (channels ``i`` and ``i + h/2``, the "rotate half" layout) turns by ``pos x theta**(-2i/h)``.

Positions are the patch's integer row and column in the grid, so a shift of the image by whole
patches leaves every attention score unchanged. The tokens before the patches (class, distillation,
register tokens) are not rotated, as in EVA and DINOv3. The absolute table is then usually dropped
(``posemb="none"``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RotaryPosition2D", "apply_rope", "rope_2d"]


def rope_2d(
    rows: torch.Tensor, cols: torch.Tensor, head_dim: int, *, theta: float = 100.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(N, head_dim)`` in float32, for tokens at (``rows``, ``cols``) (``(N,)`` each)."""
    half = head_dim // 2
    freqs = theta ** (-torch.arange(0, half, 2, dtype=torch.float32, device=rows.device) / half)  # (half / 2,)
    angles = [p.float()[:, None] * freqs for p in (rows, cols)]  # (N, half / 2) each
    angles = torch.cat([a for a in angles for _ in (0, 1)], dim=1)  # per half: [a, a] -> rotate-half pairs
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    """Within each half of the channels, ``(x1, x2) -> (-x2, x1)``."""
    parts = []
    for h in x.split(half, dim=-1):
        a, b = h.chunk(2, dim=-1)
        parts += [-b, a]
    return torch.cat(parts, dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the last ``N`` tokens of ``x`` (``(..., T, head_dim)``) by the table ``(cos, sin)``
    (``(N, head_dim)``); the ``T - N`` tokens before them are left as they are."""
    n = cos.shape[0]
    prefix, patches = x[..., : x.shape[-2] - n, :], x[..., x.shape[-2] - n :, :]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    rotated = patches * c + _rotate_half(patches, x.shape[-1] // 2) * s
    return torch.cat([prefix, rotated], dim=-2)


class RotaryPosition2D(nn.Module):
    """The attention's RoPE step (no parameters): :meth:`table` for a patch grid, and the rotation
    of queries or keys by it. Being a submodule, it also tells the speed paths that the block is
    not the paper's (:data:`vitlab.accel.blocks.BLOCK_LAYOUT`)."""

    def __init__(self, head_dim: int, *, theta: float = 100.0) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def table(self, grid: tuple[int, int], *, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        gh, gw = grid
        rows = torch.arange(gh, device=device).repeat_interleave(gw)
        cols = torch.arange(gw, device=device).repeat(gh)
        return rope_2d(rows, cols, self.head_dim, theta=self.theta)

    def forward(self, x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return apply_rope(x, *table)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta:g}"
