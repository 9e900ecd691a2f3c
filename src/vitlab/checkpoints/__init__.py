"""Reading and writing weights: vitlab's folder format and the world's formats.

One small module per foreign format; :func:`load` detects which one a path is.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from ..errors import CheckpointError
from ..models.vit import VisionTransformer
from .native import is_native, load_folder, save

__all__ = ["load", "save"]


def load(path: str | os.PathLike[str], *, strict: bool = True, **overrides: Any) -> nn.Module:
    """Load a model from a vitlab folder (other formats: see the format modules).

    ``overrides`` change the configuration (``img_size=384``, ``num_classes=10`` ...);
    position embeddings are resampled to a new ``img_size`` automatically.
    """
    if not is_native(path):
        raise CheckpointError(f"{path}: not a vitlab model folder (model.safetensors + config.json)")
    cfg, state, _ = load_folder(path)
    if overrides:
        cfg = cfg.replace(**overrides)
    model = VisionTransformer(cfg)
    result = model.load_state_dict(state, strict=strict)
    del result
    return model.eval()
