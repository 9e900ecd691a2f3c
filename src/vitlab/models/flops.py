"""Analytic multiply-accumulate counts of a ViT forward pass (matmuls only, as fvcore and timm count),
for GFLOPs in ``vitlab models`` and GFLOP/s in ``vitlab bench``."""

from __future__ import annotations

from .config import ViTConfig
from .hybrid import backbone_macs, conv_stem_macs

__all__ = ["block_macs", "count_macs"]


def count_macs(cfg: ViTConfig, img_size: tuple[int, int] | int | None = None) -> int:
    """Analytic multiply-accumulate count of a ViT forward pass at ``img_size`` (matmuls only)."""
    if img_size is None:
        h, w = cfg.img_size
    elif isinstance(img_size, int):
        h = w = img_size
    else:
        h, w = img_size
    p, d = cfg.patch_size, cfg.embed_dim
    macs, chans = 0, cfg.in_chans
    if cfg.hybrid_layers is not None:
        macs, chans, (h, w) = backbone_macs(cfg.hybrid_layers, in_chans=cfg.in_chans, height=h, width=w)
    if cfg.stem == "conv":  # CCT's tokenizer: its last convolution makes the tokens, no projection after it
        dims = dict(layers=cfg.stem_layers, width=cfg.stem_width, in_chans=cfg.in_chans, embed_dim=d)
        macs, (h, w) = conv_stem_macs(**dims, height=h, width_px=w)
    gh, gw = -(-h // p), -(-w // p)
    n = gh * gw
    t = n + cfg.num_prefix_tokens
    macs += 0 if cfg.stem == "conv" else n * p * p * chans * d  # patch projection
    per_block = block_macs(cfg, t)
    if cfg.attention == "axial":  # two half-blocks; each token attends to its row (column) and the class token
        pre = cfg.num_prefix_tokens
        per_block = 2 * (t * d * 3 * d + t * d * d + 2 * t * d * cfg.mlp_dim)
        per_block += 2 * n * (pre + gw) * d + 2 * n * (pre + gh) * d
    macs += cfg.depth * per_block
    if cfg.head == "mlp":
        macs += d * cfg.pre_logits_dim
    if cfg.pool == "seq":  # the score of every patch token, then their weighted sum
        macs += 2 * n * d
    return macs + cfg.pre_logits_dim * cfg.num_classes


def block_macs(cfg: ViTConfig, tokens: int) -> int:
    """Multiply-accumulates of one encoder block (Eq. 2-3) on ``tokens`` tokens: qkv, the two
    attention products, the output projection and the MLP (three matrices for SwiGLU)."""
    t, d = tokens, cfg.embed_dim
    mlp = (3 if cfg.mlp == "swiglu" else 2) * t * d * cfg.mlp_dim
    return t * d * 3 * d + 2 * t * t * d + t * d * d + mlp
