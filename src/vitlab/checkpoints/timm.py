"""timm ``VisionTransformer`` state dicts (``.pth``, ``.bin``, ``.safetensors``).

vitlab uses timm's parameter names, so these load as they are; two layouts
need a small adaptation:

* ``no_embed_class`` models (DeiT-III, DINOv2 and others) store the position embedding
  without rows for the class and register tokens and add it before those are prepended;
  that is the same as rows of zeros for them, which is what we insert.
* timm Hub folders carry a ``config.json`` with ``global_pool``, sometimes ``model_args``
  (``num_heads``), and a ``pretrained_cfg`` with the normalisation, the evaluation crop (``crop_pct``)
  and label names; they are read when present next to the file.

timm's standard ViTs use exact GELU, LayerNorm eps 1e-6 and bicubic resampling
of position embeddings, the defaults here.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError
from ..models.config import check_fields
from .families import architecture_fields, from_eva, is_eva_state
from .files import read_config_file
from .infer import num_registers

__all__ = ["convert_state", "is_timm_state", "read_hub_config"]

# timm architectures whose head count differs from the paper's table for their width
# (heads are invisible in the weights); read from the Hub config.json's "architecture".
_HEADS = {"vit_base_patch16_gap_224": 16}


def is_timm_state(state: dict[str, torch.Tensor]) -> bool:
    return "patch_embed.proj.weight" in state


def convert_state(state: dict[str, torch.Tensor], *, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """timm names -> vitlab names (the same for timm's ``VisionTransformer``; those of its ``Eva`` class renamed,
    :func:`.families.from_eva`), inserting the zero prefix rows of ``no_embed_class`` models."""
    out = from_eva(state, source=source) if is_eva_state(state) else dict(state)
    pe = out.get("pos_embed")
    prefix = int("cls_token" in out) + int("dist_token" in out) + num_registers(out)
    if pe is not None and prefix and pe.ndim == 3:
        n = pe.shape[1]
        if math.isqrt(n) ** 2 == n and (n < prefix or math.isqrt(n - prefix) ** 2 != n - prefix):
            out["pos_embed"] = torch.cat([pe.new_zeros(1, prefix, pe.shape[2]), pe], dim=1)
    return out


def read_hub_config(weights_path: str | Path, *, width: int | None = None) -> dict[str, Any]:
    """Fields from a timm Hub ``config.json`` beside the weights (pooling, heads, mean/std, crop_pct, label
    names, and for the families of :mod:`.families` what their architecture name implies: RoPE's convention,
    LayerNorm eps, the head count at the name's ``width``), or {}.

    A ``config.json`` that is not a small regular JSON file, or whose values have the wrong types,
    is a :class:`CheckpointError` naming it and the key."""
    cfg_path = Path(weights_path).parent / "config.json"
    if not os.path.lexists(cfg_path):
        return {}
    raw = read_config_file(cfg_path)
    if "architecture" not in raw:
        return {}
    pre = raw.get("pretrained_cfg") or {}
    args = raw.get("model_args") or {}
    for key, value in (("pretrained_cfg", pre), ("model_args", args)):
        if not isinstance(value, dict):
            raise CheckpointError(f"{cfg_path}: {key}: expected an object, got {type(value).__name__}")
    fields: dict[str, Any] = {}
    if isinstance(raw["architecture"], str):
        fields.update(architecture_fields(raw["architecture"], width=width))
    if "mean" in pre and "std" in pre:
        fields["mean"], fields["std"] = pre["mean"], pre["std"]
    if "crop_pct" in pre:
        fields["crop_pct"] = pre["crop_pct"]
    pool = raw.get("global_pool", "")
    pool = {"token": "cls", "avg": "gap", "map": "map"}.get(pool) if isinstance(pool, str) else None
    if pool:
        fields["pool"] = pool
    if "num_heads" in args:
        fields["num_heads"] = args["num_heads"]
    elif raw["architecture"] in _HEADS:
        fields["num_heads"] = _HEADS[raw["architecture"]]
    if isinstance(raw["architecture"], str) and "quickgelu" in raw["architecture"]:
        fields["act"] = "quick_gelu"  # OpenAI's CLIP weights (the activation is invisible in the weights)
    names = raw.get("label_names") or pre.get("label_names")
    if names:
        fields["class_names"] = names
    try:
        return check_fields(fields)
    except ConfigError as e:
        raise CheckpointError(f"{cfg_path}: {e}") from None
