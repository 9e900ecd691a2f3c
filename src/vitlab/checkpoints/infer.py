"""Infer a :class:`~vitlab.models.ViTConfig` from the shapes of a (timm-named) state dict.

Checkpoints rarely store their architecture, but almost all of it is in the
tensor shapes: width, in_chans and patch size from the patch projection, depth
from the block indices, MLP width from ``fc1``, the image size from the position
embedding grid times the patch size (times the ResNet's stride for hybrids, whose
stages are counted from ``patch_embed.backbone``), the head from ``head``/``pre_logits``. The
head count is not (``qkv`` is ``3D x D`` for any head count); it comes from the
paper's Table 1 (width -> heads) unless the format stores it or the caller says.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any

import torch

from ..errors import CheckpointError
from ..models.registry import VARIANTS

__all__ = ["guess_num_heads", "infer_fields", "num_registers", "variant_name"]


def guess_num_heads(width: int) -> int:
    """Heads for a width, from the paper's table; otherwise 64-wide heads (all of Table 1's)."""
    for v in VARIANTS.values():
        if v.width == width:
            return v.heads
    heads = width // 64 if width % 64 == 0 else 1
    warnings.warn(
        f"width {width} is not in the paper's table; assuming {heads} attention head(s) of width {width // heads}; "
        "pass num_heads=... if the checkpoint used another count (on the command line: `vitlab convert FILE DST "
        "--num-heads N` writes a model that states it, for any command; `vitlab finetune --init FILE` takes --heads)",
        stacklevel=3,
    )
    return heads


def variant_name(width: int, depth: int, mlp_dim: int, patch: int) -> str:
    """``vit_b16`` when the shapes are one of Table 1's rows, else ``vit_custom``."""
    for key, v in VARIANTS.items():
        if (v.width, v.depth, v.mlp_dim) == (width, depth, mlp_dim):
            return f"vit_{key}{patch}"
    return "vit_custom"


def num_registers(state: dict[str, torch.Tensor]) -> int:
    """Register tokens in a state dict: the rows of ``reg_token`` ``(1, R, D)``, else 0."""
    reg = state.get("reg_token")
    return int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0


def _grid_side(n: int, what: str) -> int:
    side = math.isqrt(n)
    if side * side != n:
        raise CheckpointError(
            f"{what}: {n} position embeddings do not form a square grid; pass img_size=(height, width)"
        )
    return side


def _hybrid_layers(state: dict[str, torch.Tensor]) -> tuple[int, ...] | None:
    """ResNet units per stage of a hybrid's backbone; ``()`` for a stem-only backbone; None if not a hybrid."""
    if not any(k.startswith("patch_embed.backbone.") for k in state):
        return None
    units: dict[int, set[int]] = {}
    for k in state:
        m = re.match(r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", k)
        if m:
            units.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return tuple(len(units[i]) for i in sorted(units))


def infer_fields(state: dict[str, torch.Tensor], *, img_size: tuple[int, int] | None = None) -> dict[str, Any]:
    """ViTConfig fields implied by a state dict in vitlab/timm naming. ``img_size``: the size a config file states (or
    the caller gives), which a table of that size's grid then has (a rectangular one, which no square inference
    finds); any other table's size is inferred as a square."""
    w = state.get("patch_embed.proj.weight")
    if w is None or w.ndim != 4:
        raise CheckpointError("not a ViT checkpoint: no 4-D 'patch_embed.proj.weight' (the patch projection)")
    width, in_chans, ph, pw = w.shape
    if ph != pw:
        raise CheckpointError(f"non-square patches {ph}x{pw} are not supported")
    hybrid = _hybrid_layers(state)
    stride = 1
    if hybrid is not None:  # Sec. 3.1's hybrid: patches of a ResNet feature map (timm's vit_*_r*_ names)
        stem = state.get("patch_embed.backbone.stem.conv.weight", state.get("patch_embed.backbone.conv.weight"))
        if stem is None:
            raise CheckpointError(
                "a hybrid checkpoint without the ResNet stem convolution 'patch_embed.backbone.stem.conv.weight'"
            )
        in_chans = stem.shape[1]
        stride = 4 * 2 ** max(len(hybrid) - 1, 0)
    block_ids = {int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k))}
    depth = max(block_ids) + 1 if block_ids else 0
    if depth == 0:
        raise CheckpointError("not a ViT checkpoint: no 'blocks.N.' transformer layers")
    fc1 = state.get("blocks.0.mlp.fc1.weight", state.get("blocks.0.mlp.fc1_g.weight"))  # (SwiGLU: the gate's)
    mlp_dim = int(fc1.shape[0]) if fc1 is not None else 4 * width
    qv_bias = "blocks.0.attn.q_bias" in state  # BEiT / EVA / DINOv3: no bias on the keys
    f: dict[str, Any] = {
        "embed_dim": int(width),
        "in_chans": int(in_chans),
        "patch_size": int(ph),
        "depth": depth,
        "mlp_dim": mlp_dim,
        "qkv_bias": "blocks.0.attn.qkv.bias" in state or qv_bias,
        "key_bias": not qv_bias,
        "mlp": "swiglu" if "blocks.0.mlp.fc1_g.weight" in state else "mlp",
        "mlp_norm": "blocks.0.mlp.norm.weight" in state,
        "attn_norm": "blocks.0.attn.norm.weight" in state,
        "class_token": "cls_token" in state,
        "name": variant_name(int(width), depth, mlp_dim, int(ph)),
        "reg_tokens": num_registers(state),
        "dist_token": "dist_token" in state,
        "pre_norm": "norm_pre.weight" in state,
        "qk_norm": "blocks.0.attn.q_norm.weight" in state,
        # layer scale: the trained gammas load over it; the value is only where training would start
        "init_values": 1e-5 if "blocks.0.ls1.gamma" in state else None,
    }
    if f["pre_norm"]:  # CLIP image towers (timm's *_clip_*): their LayerNorms use eps 1e-5, invisible in the weights
        f["norm_eps"] = 1e-5
    if hybrid is not None:
        f["hybrid_layers"] = hybrid
        f["name"] = "vit_hybrid_custom"
    prefix = (1 if f["class_token"] else 0) + int(f["dist_token"]) + f["reg_tokens"]
    if "pos_embed" in state:
        f["posemb"] = "learn"
        n, cell = state["pos_embed"].shape[-2] - prefix, ph * stride
        if img_size is not None and (img_size[0] // cell) * (img_size[1] // cell) == n:
            f["img_size"] = tuple(img_size)
        else:
            f["img_size"] = (_grid_side(n, "pos_embed") * cell,) * 2
    elif "pos_embed_row" in state and "pos_embed_col" in state:
        f["posemb"] = "learn2d"
        f["img_size"] = (state["pos_embed_row"].shape[1] * ph * stride, state["pos_embed_col"].shape[1] * ph * stride)
    else:
        f["posemb"] = "none"
    if "attn_pool.latent" in state:  # SigLIP-style attention pooling (timm's AttentionPoolLatent)
        f["pool"], f["fc_norm"] = "map", False
        pool_fc1 = state.get("attn_pool.mlp.fc1.weight")
        if pool_fc1 is not None and pool_fc1.ndim == 2 and int(pool_fc1.shape[0]) != mlp_dim:
            f["map_mlp_dim"] = int(pool_fc1.shape[0])
    elif "fc_norm.weight" in state:
        f["pool"], f["fc_norm"] = "gap", True
    else:
        f["pool"], f["fc_norm"] = ("cls" if f["class_token"] else "gap"), False
    if "pre_logits.fc.weight" in state:
        f["head"] = "mlp"
        rep = int(state["pre_logits.fc.weight"].shape[0])
        f["representation_size"] = None if rep == width else rep
    else:
        f["head"] = "linear"
    head = state.get("head.weight")
    f["num_classes"] = int(head.shape[0]) if head is not None and head.ndim == 2 else 0
    return f
