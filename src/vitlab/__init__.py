"""vitlab: the Vision Transformer of Dosovitskiy et al. (ICLR 2021), weight-compatible
with timm, Hugging Face and Google's checkpoints.

    import vitlab
    model = vitlab.create_model("vit_b16", num_classes=10)
    model = vitlab.load("path/to/checkpoint")     # timm, HF, npz or vitlab folder
    vitlab.save(model, "out/model")
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import CheckpointError, ConfigError, InputError, OfflineError, UnknownModelError, VitlabError
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


def __getattr__(name: str):  # lazy: keep `import vitlab` light
    if name in ("load", "save"):
        from . import checkpoints

        return getattr(checkpoints, name)
    raise AttributeError(f"module 'vitlab' has no attribute {name!r}")
