"""Hugging Face's DINOv2 folders (Oquab et al. 2023; ``facebook/dinov2-*``: ``Dinov2Model``, and Darcet et al. 2024's
registers: ``Dinov2WithRegistersModel``), read as vitlab's ViT with layer scale and registers, the architecture
timm's ``vit_*_patch14[_reg4]_dinov2`` names build.

==========================================  =============================================================
Hugging Face                                vitlab
==========================================  =============================================================
``embeddings.cls_token``                    ``cls_token``
``embeddings.register_tokens``              ``reg_token``
``embeddings.position_embeddings``          ``pos_embed``: the class token's row, a zero row for each register
                                            (Hugging Face adds none to them), the patches' rows
``embeddings.mask_token``                   left out (iBOT's masked-patch training only)
``encoder.layer.N.norm1`` / ``norm2``       ``blocks.N.norm1`` / ``norm2``
``...attention.{query,key,value}``          ``blocks.N.attn.qkv`` (stacked, in that order; also ``q_proj`` ...)
``...attention.output.dense``, ``o_proj``   ``blocks.N.attn.proj``
``...layer_scale{1,2}.lambda1``             ``blocks.N.ls{1,2}.gamma``
``...mlp.fc1`` / ``fc2``                    ``blocks.N.mlp.fc1`` / ``fc2``
``layernorm``                               ``norm``
==========================================  =============================================================

The model is a backbone (``num_classes=0``): its output is the class token after the final norm, Hugging Face's
``pooler_output``. What vitlab does not compute is refused by name: ``Dinov2ForImageClassification``'s classifier
(it reads the class token and the mean of the patch tokens side by side) and the giant's SwiGLU
(``use_swiglu_ffn``). At the ``config.json``'s ``image_size`` the outputs are Hugging Face's; at another size each
library resamples the position table its own way."""

from __future__ import annotations

import re
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError
from ..models.config import IMAGENET_MEAN, IMAGENET_STD, check_fields

__all__ = ["MODEL_TYPES", "from_hf"]

MODEL_TYPES = ("dinov2", "dinov2_with_registers")
"""``model_type`` of Hugging Face's DINOv2 classes."""

_FIELDS = (
    ("embed_dim", "hidden_size"),
    ("depth", "num_hidden_layers"),
    ("num_heads", "num_attention_heads"),
    ("patch_size", "patch_size"),
    ("in_chans", "num_channels"),
    ("qkv_bias", "qkv_bias"),
    ("norm_eps", "layer_norm_eps"),
    ("img_size", "image_size"),
)
"""(ViTConfig field, ``Dinov2Config`` key)."""

_RENAMES = (
    (r"^embeddings\.cls_token$", "cls_token"),
    (r"^embeddings\.register_tokens$", "reg_token"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.(norm[12])\.", r"blocks.\1.\2."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.layer_scale([12])\.lambda1$", r"blocks.\1.ls\2.gamma"),
    (r"^(?:encoder\.layer|layers)\.(\d+)\.mlp\.(fc[12])\.", r"blocks.\1.mlp.\2."),
    (r"^layernorm\.", "norm."),
)
_QKV = re.compile(
    r"^(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.(query|key|value)|(q|k|v)_proj)\.(weight|bias)$"
)


def from_hf(
    raw: dict[str, Any], state: dict[str, torch.Tensor], *, source: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A DINOv2 folder's ``config.json`` (``raw``) and weights (Hugging Face's names) -> ``(state in vitlab's names,
    ViTConfig fields)``; see the module's table."""
    if any(k.startswith("classifier.") for k in state):
        raise CheckpointError(
            f"{source}: Dinov2ForImageClassification: its classifier reads the class token and the mean of the patch "
            "tokens side by side, a pooling vitlab does not compute; not loaded (its backbone, Dinov2Model, loads)"
        )
    if raw.get("use_swiglu_ffn"):
        raise CheckpointError(f"{source}: use_swiglu_ffn (DINOv2's giant): not computed by vitlab's reader; not loaded")
    fields = _fields(raw, source=source)
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        k = key.removeprefix("dinov2.")
        if k == "embeddings.mask_token":
            continue
        if k == "embeddings.position_embeddings":
            regs = fields.get("reg_tokens", 0)
            out["pos_embed"] = torch.cat([t[:, :1], t.new_zeros(1, regs, t.shape[-1]), t[:, 1:]], dim=1)
            continue
        m = _QKV.match(k)
        if m:
            qkv.setdefault((m.group(1), m.group(4)), {})[(m.group(2) or m.group(3))[0]] = t
            continue
        for pat, rep in _RENAMES:
            new, n = re.subn(pat, rep, k)
            if n:
                out[new] = t
                break
        else:
            out[key] = t  # unknown: reported as unexpected by the loader
    for (i, kind), parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{source}: layer {i}: attention {kind} has only {', '.join(sorted(parts))}")
        out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out, fields


def _fields(raw: dict[str, Any], *, source: str) -> dict[str, Any]:
    """ViTConfig fields of a ``Dinov2Config``, each checked: a bad value is a :class:`CheckpointError` naming
    ``source`` and the key."""
    f: dict[str, Any] = {"num_classes": 0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "extra": {"family": "DINOv2"}}
    for ours, theirs in _FIELDS:
        if theirs in raw:
            try:
                f.update(check_fields({ours: raw[theirs]}))
            except ConfigError as e:
                raise CheckpointError(f"{source}: {theirs}{str(e)[len(ours) :]}") from None
    ratio, act = raw.get("mlp_ratio", 4), raw.get("hidden_act", "gelu")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 64:
        raise CheckpointError(f"{source}: mlp_ratio: expected a positive number")
    if act not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        raise CheckpointError(f"{source}: hidden_act {act!r:.40}: vitlab's DINOv2 has exact or tanh GELU")
    f["act"] = "gelu" if act == "gelu" else "gelu_tanh"
    f["mlp_dim"] = int(f.get("embed_dim", 768) * ratio)
    scale = raw.get("layerscale_value", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise CheckpointError(f"{source}: layerscale_value: expected a number")
    f["init_values"] = float(scale)
    regs = raw.get("num_register_tokens", 0)
    if isinstance(regs, bool) or not isinstance(regs, int) or not 0 <= regs <= 64:
        raise CheckpointError(f"{source}: num_register_tokens: expected a whole number from 0 to 64")
    f["reg_tokens"] = regs
    return f
