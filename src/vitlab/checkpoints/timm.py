"""timm ``VisionTransformer`` state dicts (``.pth``, ``.bin``, ``.safetensors``).

vitlab uses timm's parameter names, so these load as they are; two layouts
need a small adaptation:

* ``no_embed_class`` models (DeiT-III and others) store the position embedding
  without a class row and add it before the class token is prepended; that is
  the same as a class row of zeros, which is what we insert.
* timm Hub folders carry a ``config.json`` with ``global_pool``, sometimes ``model_args``
  (``num_heads``), and a ``pretrained_cfg`` with the normalisation and label names; they are
  read when present next to the file.

timm's standard ViTs use exact GELU, LayerNorm eps 1e-6 and bicubic resampling
of position embeddings, the defaults here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

__all__ = ["convert_state", "is_timm_state", "read_hub_config"]

# timm architectures whose head count differs from the paper's table for their width
# (heads are invisible in the weights); read from the Hub config.json's "architecture".
_HEADS = {"vit_base_patch16_gap_224": 16}


def is_timm_state(state: dict[str, torch.Tensor]) -> bool:
    return "patch_embed.proj.weight" in state


def convert_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm names -> vitlab names (the same), inserting the zero class row of ``no_embed_class`` models."""
    out = dict(state)
    pe = out.get("pos_embed")
    if pe is not None and "cls_token" in out and pe.ndim == 3:
        n = pe.shape[1]
        if math.isqrt(n) ** 2 == n and math.isqrt(n - 1) ** 2 != n - 1:
            out["pos_embed"] = torch.cat([pe.new_zeros(1, 1, pe.shape[2]), pe], dim=1)
    return out


def read_hub_config(weights_path: str | Path) -> dict[str, Any]:
    """Fields from a timm Hub ``config.json`` beside the weights (pooling, heads, mean/std, label names), or {}."""
    cfg_path = Path(weights_path).parent / "config.json"
    try:
        raw = json.loads(cfg_path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict) or "architecture" not in raw:
        return {}
    pre = raw.get("pretrained_cfg") or {}
    fields: dict[str, Any] = {}
    if "mean" in pre and "std" in pre:
        fields["mean"], fields["std"] = tuple(pre["mean"]), tuple(pre["std"])
    pool = {"token": "cls", "avg": "gap"}.get(raw.get("global_pool", ""))
    if pool:
        fields["pool"] = pool
    args = raw.get("model_args") or {}
    if isinstance(args.get("num_heads"), int):
        fields["num_heads"] = args["num_heads"]
    elif raw["architecture"] in _HEADS:
        fields["num_heads"] = _HEADS[raw["architecture"]]
    names = raw.get("label_names") or pre.get("label_names")
    if isinstance(names, list) and names:
        fields["class_names"] = [str(n) for n in names]
    return fields
