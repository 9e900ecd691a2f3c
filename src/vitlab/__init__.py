"""vitlab: the Vision Transformer of Dosovitskiy et al. (ICLR 2021), weight-compatible
with timm, Hugging Face and Google's checkpoints.

    import vitlab
    model = vitlab.create_model("vit_b16", num_classes=10)
    model = vitlab.load("path/to/checkpoint")     # timm, HF, npz or vitlab folder
    vitlab.save(model, "out/model")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import CheckpointError, ConfigError, InputError, OfflineError, UnknownModelError, VitlabError

if TYPE_CHECKING:
    from .checkpoints import load, save
    from .models import VisionTransformer, ViTConfig, create_model, list_models, resample_posemb

__all__ = [
    "CheckpointError",
    "ConfigError",
    "InputError",
    "OfflineError",
    "UnknownModelError",
    "ViTConfig",
    "VisionTransformer",
    "VitlabError",
    "__version__",
    "create_model",
    "list_models",
    "load",
    "resample_posemb",
    "save",
]


# Lazy: `import vitlab` (and so `vitlab --help`) does not import torch until a model is needed.
_LAZY = {
    "load": "checkpoints",
    "save": "checkpoints",
    "VisionTransformer": "models",
    "ViTConfig": "models",
    "create_model": "models",
    "list_models": "models",
    "resample_posemb": "models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")
