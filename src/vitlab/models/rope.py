"""2-D rotary position embeddings (RoPE) for the patch tokens, in the conventions of EVA-02, the Perception
Encoder and DINOv3, and vitlab's own.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding") rotates each
pair of query and key channels by an angle proportional to the token's position, so that the dot
product ``q_m . k_n`` depends on the positions only through ``m - n``. The 2-D axial form (Fang et
al. 2023, "EVA-02: A Visual Representation for Neon Genesis", Sec. 2; Heo et al. 2024, "Rotary
Position Embedding for Vision Transformer"; Simeoni et al. 2025, DINOv3) gives half of each head's
channel pairs the patch's position along one axis and the other half its position along the other.
With ``n = head_dim / 4`` frequencies per axis, pair ``k`` of an axis turns by ``pos x theta**(-k/n)``.

The conventions differ in which channels pair up, which axis comes first and what a position is
(``rope_kind``, :data:`~.config.ROPE_KINDS`):

=========  ==============================================  =========================================
kind       channel pairs                                   positions
=========  ==============================================  =========================================
``axial``  ``i`` and ``i + h/2`` within each half ``h`` of  integer row (first half), column (second)
           the head (vitlab's own, ``rope=True``)
``eva``    adjacent channels ``2j``, ``2j + 1``; pairs      integer row, column (+ ``offset``), scaled
           ``0..n-1`` rows, ``n..2n-1`` columns (EVA-02,    to a reference grid (``ref_grid``: the
           timm's ``RotaryEmbeddingCat``)                   pre-training grid, 16x16 in EVA-02)
``pe``     as ``eva``, columns first (the Perception        as ``eva`` (offset 1 in PE core T/S/B/L)
           Encoder, Bolya et al. 2025; timm's ``xy``)
``dinov3`` ``j`` and ``j + head_dim/2`` over the whole      patch centres ``(i + 0.5) / size``
           head; ``j < n`` rows, ``n <= j < 2n`` columns    mapped to [-1, 1] per axis, angle
           (DINOv3; timm's ``RotaryEmbeddingDinoV3``,       ``2 pi x pos x theta**(-k/n)``
           Hugging Face's ``DINOv3ViTRopePositionEmbedding``)
=========  ==============================================  =========================================

The tokens before the patches (class, distillation, register tokens) are not rotated, as in EVA, the
Perception Encoder and DINOv3; the absolute table is then usually dropped (``posemb="none"``), except in
EVA-02 and the Perception Encoder, which keep both.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["RotaryPosition2D", "apply_rope", "rope_2d", "rope_table"]


def rope_2d(
    rows: torch.Tensor, cols: torch.Tensor, head_dim: int, *, theta: float = 100.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """vitlab's ``axial`` table: ``(cos, sin)``, each ``(N, head_dim)`` in float32, for tokens at (``rows``,
    ``cols``) (``(N,)`` each)."""
    half = head_dim // 2
    freqs = theta ** (-torch.arange(0, half, 2, dtype=torch.float32, device=rows.device) / half)  # (half / 2,)
    angles = [p.float()[:, None] * freqs for p in (rows, cols)]  # (N, half / 2) each
    angles = torch.cat([a for a in angles for _ in (0, 1)], dim=1)  # per half: [a, a] -> rotate-half pairs
    return angles.cos(), angles.sin()


def _axis_positions(
    kind: str, size: int, *, ref: int | None, offset: float, device: torch.device | None
) -> torch.Tensor:
    """The positions of the ``size`` patches along one axis (float32)."""
    i = torch.arange(size, dtype=torch.float32, device=device)
    if kind == "dinov3":  # patch centres, normalised to [0, 1] then mapped to [-1, 1]
        return ((i + 0.5) / size) * 2.0 - 1.0
    p = i + offset
    return p if ref is None else p / size * ref  # EVA's rescaling to the pre-training grid


def rope_table(
    kind: str,
    grid: tuple[int, int],
    head_dim: int,
    *,
    theta: float,
    ref_grid: tuple[int, int] | None = None,
    offset: float = 0.0,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``(rows x cols, head_dim)`` in float32, of the patches of ``grid`` (row-major) in
    the convention ``kind`` (the table of the module docstring)."""
    gh, gw = grid
    if kind == "axial":
        rows = torch.arange(gh, device=device).repeat_interleave(gw)
        cols = torch.arange(gw, device=device).repeat(gh)
        return rope_2d(rows, cols, head_dim, theta=theta)
    n = head_dim // 4
    freqs = theta ** (-torch.arange(n, dtype=torch.float32, device=device) / n)  # theta**(-k/n), k < n
    if kind == "dinov3":
        freqs = 2 * math.pi * freqs
    ref_h, ref_w = ref_grid if ref_grid is not None else (None, None)
    rows = _axis_positions(kind, gh, ref=ref_h, offset=offset, device=device).repeat_interleave(gw)  # (N,)
    cols = _axis_positions(kind, gw, ref=ref_w, offset=offset, device=device).repeat(gh)
    first, second = (cols, rows) if kind == "pe" else (rows, cols)
    angles = torch.cat([first[:, None] * freqs, second[:, None] * freqs], dim=1)  # (N, head_dim / 2)
    # dinov3 pairs channel j with j + head_dim / 2, the others 2j with 2j + 1
    angles = torch.cat([angles, angles], dim=1) if kind == "dinov3" else angles.repeat_interleave(2, dim=1)
    return angles.cos(), angles.sin()


def _rotate_halves(x: torch.Tensor, half: int) -> torch.Tensor:
    """``axial``: within each half of the channels, ``(x1, x2) -> (-x2, x1)``."""
    parts = []
    for h in x.split(half, dim=-1):
        a, b = h.chunk(2, dim=-1)
        parts += [-b, a]
    return torch.cat(parts, dim=-1)


def _rotate(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The partner of each channel, signed: ``x`` rotated by a quarter turn in every pair of ``kind``."""
    if kind == "axial":
        return _rotate_halves(x, x.shape[-1] // 2)
    if kind == "dinov3":  # (x1, x2) -> (-x2, x1) over the whole head
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)  # (x_2j, x_2j+1) -> (-x_2j+1, x_2j)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kind: str = "axial") -> torch.Tensor:
    """Rotate the last ``N`` tokens of ``x`` (``(..., T, head_dim)``) by the table ``(cos, sin)``
    (``(N, head_dim)``, or ``(B, N, head_dim)`` for each image's own tokens, after token dropping):
    ``x cos + rotate(x) sin``; the ``T - N`` tokens before them are left as they are."""
    n = cos.shape[-2]
    prefix, patches = x[..., : x.shape[-2] - n, :], x[..., x.shape[-2] - n :, :]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if c.ndim == 3 and x.ndim == 4:  # (B, N, hd) -> (B, 1, N, hd): the same for every head
        c, s = c[:, None], s[:, None]
    rotated = patches * c + _rotate(patches, kind) * s
    return torch.cat([prefix, rotated], dim=-2)


class RotaryPosition2D(nn.Module):
    """The attention's RoPE step (no parameters): :meth:`table` for a patch grid, and the rotation
    of queries or keys by it. Being a submodule, it also tells the speed paths that the block is
    not the paper's (:data:`vitlab.accel.blocks.BLOCK_LAYOUT`)."""

    def __init__(
        self,
        head_dim: int,
        *,
        theta: float = 100.0,
        kind: str = "axial",
        ref_grid: tuple[int, int] | None = None,
        offset: float = 0.0,
    ) -> None:
        super().__init__()
        self.head_dim, self.theta, self.kind = head_dim, theta, kind
        self.ref_grid, self.offset = ref_grid, offset

    def table(self, grid: tuple[int, int], *, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_table(
            self.kind, grid, self.head_dim, theta=self.theta, ref_grid=self.ref_grid, offset=self.offset, device=device
        )

    def forward(self, x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return apply_rope(x, *table, kind=self.kind)

    def extra_repr(self) -> str:
        ref = f", ref_grid={self.ref_grid}" if self.ref_grid else ""
        return f"head_dim={self.head_dim}, theta={self.theta:g}, kind={self.kind}{ref}, offset={self.offset:g}"
