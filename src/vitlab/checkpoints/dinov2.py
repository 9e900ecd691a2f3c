"""Hugging Face's DINOv2 folders (Oquab et al. 2023; ``facebook/dinov2-*``: ``Dinov2Model``, and Darcet et al. 2024's
registers: ``Dinov2WithRegistersModel``), read as vitlab's ViT with layer scale and registers, the architecture
timm's ``vit_*_patch14[_reg4]_dinov2`` names build.

Its names are the ViT's of :mod:`.hf` (``embeddings.*``, ``encoder.layer.N.attention.*``, ``mlp.fc1``, ``layernorm``)
and three of its own, in the same table: ``norm1``/``norm2`` (``blocks.N.norm1``/``norm2``),
``layer_scale{1,2}.lambda1`` (``blocks.N.ls{1,2}.gamma``) and ``embeddings.register_tokens`` (``reg_token``);
``embeddings.mask_token`` (iBOT's masked-patch training only) is left out. What this module adds: the fields of a
``Dinov2Config`` (``mlp_ratio``, ``layerscale_value``, ``num_register_tokens``), and the position table's rows for the
registers, zero (Hugging Face adds the class token's row and none to a register).

The model is a backbone (``num_classes=0``): its output is the class token after the final norm, Hugging Face's
``pooler_output``. What vitlab does not compute is refused by name: ``Dinov2ForImageClassification``'s classifier
(it reads the class token and the mean of the patch tokens side by side) and the giant's SwiGLU
(``use_swiglu_ffn``). The outputs are Hugging Face's at the ``config.json``'s ``image_size`` and at any other size:
the position table is resampled as each class resamples it, bicubic, antialiased in ``Dinov2WithRegistersModel`` and
not in ``Dinov2Model`` (``posemb_resample``), so the 224-px inputs its image processor makes (from a table made for
518) give Hugging Face's features too (:func:`vitlab.resolve.open_model` serves the folder at that side)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import CheckpointError
from ..models.config import IMAGENET_MEAN, IMAGENET_STD
from .files import stated_fields

__all__ = ["MODEL_TYPES", "fields", "with_register_rows"]

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


def fields(raw: dict[str, Any], state: dict[str, torch.Tensor], *, source: str) -> dict[str, Any]:
    """The ViTConfig fields of a DINOv2 folder's ``config.json`` (``raw``), each checked: a bad value is a
    :class:`CheckpointError` naming ``source`` and the key, as is what vitlab does not compute (see the module's
    notes; ``state``: the folder's weights, in Hugging Face's names)."""
    if any(k.startswith("classifier.") for k in state):
        raise CheckpointError(
            f"{source}: Dinov2ForImageClassification: its classifier reads the class token and the mean of the patch "
            "tokens side by side, a pooling vitlab does not compute; not loaded (its backbone, Dinov2Model, loads)"
        )
    if raw.get("use_swiglu_ffn"):
        raise CheckpointError(f"{source}: use_swiglu_ffn (DINOv2's giant): not computed by vitlab's reader; not loaded")
    f: dict[str, Any] = {"num_classes": 0, "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "extra": {"family": "DINOv2"}}
    f.update(stated_fields(raw, _FIELDS, source=source))
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
    f["posemb_resample"] = "bicubic" if raw.get("model_type") == "dinov2_with_registers" else "bicubic-no-antialias"
    return f


def with_register_rows(state: dict[str, torch.Tensor], registers: int) -> dict[str, torch.Tensor]:
    """``state`` (vitlab's names) with a zero position row for each of ``registers`` register tokens after the class
    token's: Hugging Face's table has none for them (it inserts the registers after adding it), vitlab's has a row for
    every prefix token."""
    pe = state.get("pos_embed")
    if registers and pe is not None and pe.ndim == 3:
        state = {**state, "pos_embed": torch.cat([pe[:, :1], pe.new_zeros(1, registers, pe.shape[-1]), pe[:, 1:]], 1)}
    return state
