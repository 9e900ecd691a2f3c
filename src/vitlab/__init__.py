"""vitlab: the Vision Transformer of Dosovitskiy et al. (ICLR 2021), weight-compatible
with timm, Hugging Face and Google's checkpoints.

    import vitlab
    model = vitlab.create_model("vit_b16", num_classes=10)
    model = vitlab.load("path/to/checkpoint")     # timm, HF, npz or vitlab folder
    model = vitlab.resolve_model("runs/X")        # a model argument, by the commands' one rule
    x = vitlab.transforms_for(model)(pil_image)   # its evaluation preprocessing
    vitlab.save(model, "out/model")
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ._lazy import lazy_names
from ._version import __version__
from .errors import CheckpointError, ConfigError, InputError, OfflineError, UnknownModelError, VitlabError

if TYPE_CHECKING:
    from torch import nn

    from .checkpoints import save
    from .evaluate.accuracy import transforms_for
    from .models import VisionTransformer, ViTConfig, list_models, resample_posemb
    from .resolve import resolve_model

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
    "resolve_model",
    "save",
    "transforms_for",
]


def create_model(
    name: str, pretrained: bool = False, *, checkpoint_path: str | os.PathLike[str] | None = None, **kwargs: Any
) -> nn.Module:
    """A registered model, ours (``"vit_b16"``, ``"B/16"``) or by timm's name (``"vit_base_patch16_224"``,
    ``"deit_small_patch16_224"``), with the speed paths of :mod:`vitlab.accel` (off:
    ``vitlab.accel.set_enabled(False)``). Keyword arguments as :func:`vitlab.models.create_model`
    (timm's ``num_classes``, ``global_pool``, ``img_size``, ``drop_path_rate``...).

    As timm's ``create_model``: randomly initialised, or with ``pretrained=True`` the public weights
    for the name (:func:`vitlab.checkpoints.hub.pretrained_name`; downloaded and cached, an
    :class:`OfflineError` saying what to fetch when offline), or ``checkpoint_path`` weights loaded
    into the named architecture (every tensor must fit). ``features_only=True`` (with timm's ``out_indices``,
    default 3): the patch-token maps of the chosen blocks, as timm's (:class:`vitlab.models.timm_api.FeatureGetter`)."""
    from .accel import accelerate
    from .checkpoints import load as read
    from .checkpoints import load_state, read_checkpoint
    from .checkpoints.hub import pretrained_name
    from .models import create_model as build
    from .models.registry import timm_kwargs
    from .models.timm_api import FeatureGetter

    features_only = kwargs.pop("features_only", False)
    out_indices = kwargs.pop("out_indices", None)
    if out_indices is not None and not features_only:
        raise ConfigError("out_indices: an option of features_only=True")
    if pretrained and checkpoint_path is not None:
        raise ConfigError("pass pretrained=True or checkpoint_path=..., not both")
    if pretrained:  # the architecture comes with the weights; the keyword arguments adapt it
        model = read(pretrained_name(name), **timm_kwargs(kwargs))
    else:
        model = build(name, **kwargs)
        if checkpoint_path is not None:
            load_state(model, read_checkpoint(checkpoint_path).state, source=str(checkpoint_path))
    model = accelerate(model)
    return FeatureGetter(model, out_indices=3 if out_indices is None else out_indices) if features_only else model


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
    "transforms_for": "evaluate.accuracy",
    "resolve_model": "resolve",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__, keep=False)
