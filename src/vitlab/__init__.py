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
    from torch import nn

    from .checkpoints import save
    from .models import VisionTransformer, ViTConfig, list_models, resample_posemb

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


def create_model(name: str, **kwargs: Any) -> nn.Module:
    """A registered model (``"vit_b16"``, ``"B/16"``, ``"ViT-B/16"``...), randomly initialised,
    with the speed paths of :mod:`vitlab.accel` (off: ``vitlab.accel.set_enabled(False)``).
    Keyword arguments as :func:`vitlab.models.create_model` (timm's: ``num_classes``,
    ``img_size``, ``drop_path_rate``...)."""
    from .accel import accelerate
    from .models import create_model as build

    return accelerate(build(name, **kwargs))


def load(source: Any, **kwargs: Any) -> nn.Module:
    """A model with weights from a checkpoint (timm, Hugging Face, ``.npz``, a vitlab folder or a
    public name), with the speed paths of :mod:`vitlab.accel`. Keyword arguments as
    :func:`vitlab.checkpoints.load`."""
    from .accel import accelerate
    from .checkpoints import load as read

    return accelerate(read(source, **kwargs))


# Lazy: `import vitlab` (and so `vitlab --help`) does not import torch until a model is needed.
_LAZY = {
    "save": "checkpoints",
    "VisionTransformer": "models",
    "ViTConfig": "models",
    "list_models": "models",
    "resample_posemb": "models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")
