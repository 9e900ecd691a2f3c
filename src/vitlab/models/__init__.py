"""The paper's models: the Vision Transformer (Eq. 1-4), its variants (hybrid, axial, position
embeddings, masked patch prediction) and the registry of named configurations. Nothing here
imports from the rest of vitlab except errors; the speed paths live in :mod:`vitlab.accel`.

The names below are imported when first used (PEP 562), so that :mod:`vitlab.models.config` and
:mod:`vitlab.models.variants` (a model's fields, the named variants) are read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, ViTConfig
    from .flexi import resample_patch_embed
    from .flops import count_macs
    from .layers import Attention, Block, DropPath, Mlp, PatchDropout, PatchEmbed
    from .posemb import resample_posemb, sincos_2d
    from .registry import create_model, register, registered_config
    from .variants import VARIANTS, list_models, model_config, resolve_name
    from .vit import VisionTransformer

_WHERE = {
    "IMAGENET_MEAN": "config",
    "IMAGENET_STD": "config",
    "INCEPTION_MEAN": "config",
    "INCEPTION_STD": "config",
    "ViTConfig": "config",
    "resample_patch_embed": "flexi",
    "count_macs": "flops",
    "Attention": "layers",
    "Block": "layers",
    "DropPath": "layers",
    "Mlp": "layers",
    "PatchDropout": "layers",
    "PatchEmbed": "layers",
    "resample_posemb": "posemb",
    "sincos_2d": "posemb",
    "VARIANTS": "variants",
    "list_models": "variants",
    "model_config": "variants",
    "resolve_name": "variants",
    "create_model": "registry",
    "register": "registry",
    "registered_config": "registry",
    "VisionTransformer": "vit",
}
"""Public name -> the module that defines it."""

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "INCEPTION_MEAN",
    "INCEPTION_STD",
    "VARIANTS",
    "Attention",
    "Block",
    "DropPath",
    "Mlp",
    "PatchDropout",
    "PatchEmbed",
    "ViTConfig",
    "VisionTransformer",
    "count_macs",
    "create_model",
    "list_models",
    "model_config",
    "register",
    "registered_config",
    "resample_patch_embed",
    "resample_posemb",
    "resolve_name",
    "sincos_2d",
]


def __dir__() -> list[str]:
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
