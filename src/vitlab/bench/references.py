"""What vitlab is compared with: the timm / Hugging Face model of the same architecture (or a
second copy of ours), the optimizer each side trains with, and the architecture flags of the
CLI as ``create_model`` overrides."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..accel import accelerate
from ..errors import ConfigError, VitlabError
from ..models import Block, PatchEmbed, VisionTransformer, ViTConfig
from ..models.config import mlp_dim_for

__all__ = [
    "REFERENCES",
    "MissingReferenceError",
    "build_reference",
    "is_plain_vit",
    "model_overrides",
    "plain_adamw",
    "vitlab_optimizer",
]

REFERENCES = ("timm", "hf", "vitlab")


class MissingReferenceError(VitlabError, ImportError):
    """``--vs timm`` / ``--vs hf`` without the package installed."""


def model_overrides(
    *,
    img_size: int | None = None,
    patch_size: int | None = None,
    dim: int | None = None,
    depth: int | None = None,
    heads: int | None = None,
    mlp_ratio: float | None = None,
    base_dim: int | None = None,
) -> dict[str, Any]:
    """The architecture flags of ``vitlab train`` / ``vitlab bench`` as ``create_model`` overrides."""
    ov: dict[str, Any] = {}
    for key, val in (
        ("img_size", img_size),
        ("patch_size", patch_size),
        ("embed_dim", dim),
        ("depth", depth),
        ("num_heads", heads),
    ):
        if val is not None:
            ov[key] = val
    if mlp_ratio is not None:
        width = dim or base_dim
        if width is None:
            raise ConfigError("mlp_ratio: the model width is unknown; pass dim as well")
        ov["mlp_dim"] = mlp_dim_for(width, mlp_ratio)
    return ov


def is_plain_vit(model: nn.Module) -> bool:
    """A plain ViT: patch-conv stem and standard blocks (not the hybrid's ResNet stem or axial blocks)."""
    return (
        isinstance(model, VisionTransformer)
        and type(model.patch_embed) is PatchEmbed
        and all(isinstance(b, Block) for b in model.blocks)  # type: ignore[union-attr]
    )


def build_reference(kind: str, cfg: ViTConfig) -> nn.Module:
    """The timm or Hugging Face model with the same architecture as ``cfg``, or (``vitlab``)
    a second copy of ours: an A/A control whose ratio should be 1, so its spread is the noise
    floor of the measurement on this machine.

    Only plain ViTs (class token or GAP, learned 1-D posemb, linear head) have
    a timm / HF equivalent; anything else raises ``ConfigError``.
    """
    if kind == "vitlab":
        return accelerate(VisionTransformer(cfg))
    if cfg.posemb != "learn" or cfg.head != "linear" or cfg.dynamic_img_pad:
        raise ConfigError(f"--vs {kind}: only plain ViTs (learned posemb, linear head) have a {kind} equivalent")
    if kind == "timm":
        return _timm_vit(cfg)
    if kind == "hf":
        return _hf_vit(cfg)
    raise ConfigError(f"--vs: {kind!r} is not one of {', '.join(REFERENCES)}")


def _timm_vit(cfg: ViTConfig) -> nn.Module:
    try:
        from timm.models.vision_transformer import VisionTransformer as TimmViT
    except ImportError as e:
        raise MissingReferenceError("--vs timm needs timm: pip install timm") from e
    act = nn.GELU if cfg.act == "gelu" else (lambda: nn.GELU(approximate="tanh"))
    return TimmViT(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=cfg.num_classes,
        global_pool="token" if cfg.pool == "cls" else "avg",
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_dim / cfg.embed_dim,
        qkv_bias=cfg.qkv_bias,
        class_token=cfg.class_token,
        fc_norm=cfg.fc_norm if cfg.pool == "gap" else False,
        act_layer=act,
    )


def _hf_vit(cfg: ViTConfig) -> nn.Module:
    if cfg.pool != "cls" or cfg.img_size[0] != cfg.img_size[1]:
        raise ConfigError("--vs hf: Hugging Face's ViT has class-token pooling and square images only")
    try:
        from transformers import ViTConfig as HFConfig
        from transformers import ViTForImageClassification
    except ImportError as e:
        raise MissingReferenceError("--vs hf needs transformers: pip install transformers") from e
    hf_cfg = HFConfig(
        hidden_size=cfg.embed_dim,
        num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.num_heads,
        intermediate_size=cfg.mlp_dim,
        hidden_act="gelu" if cfg.act == "gelu" else "gelu_pytorch_tanh",
        layer_norm_eps=cfg.norm_eps,
        image_size=cfg.img_size[0],
        patch_size=cfg.patch_size,
        num_channels=cfg.in_chans,
        num_labels=max(cfg.num_classes, 1),
        qkv_bias=cfg.qkv_bias,
    )
    hf_cfg._attn_implementation = "sdpa"
    return _LogitsOnly(ViTForImageClassification(hf_cfg))


class _LogitsOnly(nn.Module):
    """Hugging Face models return an output object; the bench wants a tensor."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(pixel_values=x).logits


def vitlab_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """What ``vitlab train`` builds (the ``small-data`` recipe's AdamW: parameter groups, fused kernel)."""
    from ..train.conf.recipes import get_recipe
    from ..train.engine.optim import build_optimizer

    return build_optimizer(model, get_recipe("small-data"), 1e-3)


def plain_adamw(model: nn.Module) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` as a timm / HF user writes it: one parameter group, PyTorch's default kernel."""
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
