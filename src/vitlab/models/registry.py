"""Building the named models: each registered name (:mod:`vitlab.models.variants`) has a builder.

``create_model("vit_b16")`` and ``create_model("B/16")`` are the same model.
Other families (hybrid, axial) register their own builders with :func:`register`. :func:`registered_config` gives
the :class:`~vitlab.models.config.ViTConfig` ``create_model`` would build, without building it (``vitlab models``
lists 78 names from their configs' arithmetic instead of 78 models on the meta device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, UnknownModelError
from .config import ViTConfig, mlp_dim_for
from .timm_api import pool_name
from .variants import (
    _PATCHES,
    BACKBONES,
    CCTS,
    HYBRIDS,
    TIMM_ALIASES,
    VARIANTS,
    Variant,
    add_name,
    close_names,
    list_models,
    model_config,
    resolve_name,
)
from .vit import VisionTransformer

__all__ = [
    "BACKBONES",
    "HYBRIDS",
    "TIMM_ALIASES",
    "VARIANTS",
    "Variant",
    "create_model",
    "list_models",
    "model_config",
    "register",
    "registered_config",
    "resolve_name",
    "timm_kwargs",
]

Builder = Callable[..., nn.Module]
Configure = Callable[..., ViTConfig]
_BUILDERS: dict[str, Builder] = {}
_CONFIGS: dict[str, Configure] = {}


def register(name: str, builder: Builder, *, config: Configure | None = None) -> None:
    """Make ``create_model(name, ...)`` call ``builder(num_classes=..., img_size=..., **overrides)``. ``config``: the
    function of the same arguments that gives the config ``builder``'s model is built from, when there is one
    (:func:`registered_config` then reads it instead of building the model)."""
    _BUILDERS[name] = builder
    if config is not None:
        _CONFIGS[name] = config
    else:
        _CONFIGS.pop(name, None)
    add_name(name)


def _register_vit(name: str, configure: Configure) -> None:
    register(name, lambda **kw: VisionTransformer(configure(**kw)), config=configure)


for _v, _ps in _PATCHES.items():
    for _p in _ps:
        _register_vit(f"vit_{_v}{_p}", lambda _n=f"vit_{_v}{_p}", **kw: model_config(_n, **kw))
for _name in (*HYBRIDS, *CCTS, *BACKBONES, *(f"axial_vit_b{p}" for p in (16, 32))):  # (Axial-ViT: Appendix D.6)
    _register_vit(_name, lambda _n=_name, **kw: model_config(_n, **kw))


def timm_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """timm's ``create_model`` keyword arguments as :class:`ViTConfig` fields: ``global_pool``
    (``token``/``avg`` or ours) -> ``pool``, ``mlp_ratio`` -> ``mlp_dim``; ``dynamic_img_size`` taken and dropped
    (a vitlab model takes any input size whose sides the patch divides, its position embeddings resampled at each
    call, as timm's ``dynamic_img_size=True`` model does); the rest as they are."""
    out = dict(kwargs)
    if "dynamic_img_size" in out:
        dynamic = out.pop("dynamic_img_size")
        if not isinstance(dynamic, bool):
            raise ConfigError(f"dynamic_img_size: expected True or False, got {type(dynamic).__name__}")
    if "global_pool" in out:
        pool = out.pop("global_pool")
        if not isinstance(pool, str):
            raise ConfigError(f"global_pool: expected a string, got {type(pool).__name__}")
        out["pool"] = pool_name(pool)
    return out


def create_model(
    name: str, *, num_classes: int | None = None, img_size: int | tuple[int, int] | None = None, **overrides: Any
) -> nn.Module:
    """Build a registered model, randomly initialised (use :func:`vitlab.load` for weights).
    ``name`` is ours (``vit_s16``, ``S/16``) or timm's (``vit_small_patch16_224``,
    ``deit_small_patch16_224``); keyword arguments are :class:`ViTConfig` fields or timm's
    (``global_pool``, ``mlp_ratio``).

    >>> model = create_model("vit_s16", num_classes=10, img_size=384, drop_path_rate=0.1)
    """
    canon, fields = _arguments(name, num_classes=num_classes, img_size=img_size, overrides=overrides)
    return _BUILDERS[canon](**fields)


def registered_config(
    name: str, *, num_classes: int | None = None, img_size: int | tuple[int, int] | None = None, **overrides: Any
) -> ViTConfig:
    """The config of ``create_model(name, ...)``'s model (the same arguments), from the registered config function
    without building the model; a name registered with a builder alone is built on the meta device."""
    canon, fields = _arguments(name, num_classes=num_classes, img_size=img_size, overrides=overrides)
    configure = _CONFIGS.get(canon)
    if configure is not None:
        return configure(**fields)
    with torch.device("meta"):
        config: ViTConfig = _BUILDERS[canon](**fields).config
    return config


def _arguments(
    name: str, *, num_classes: int | None, img_size: int | tuple[int, int] | None, overrides: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """``(canonical name, the builder's keyword arguments)`` for ``create_model(name, ...)``'s arguments."""
    canon = resolve_name(name)
    if canon not in _BUILDERS:
        close = close_names(canon, also=tuple(TIMM_ALIASES))
        hint = f"; did you mean {', '.join(close)}?" if close else "; run `vitlab models` for the list"
        raise UnknownModelError(f"unknown model {name!r}{hint}")
    implied = dict(TIMM_ALIASES.get(name.strip().lower().split(".", 1)[0], ("", {}))[1])
    if canon in BACKBONES:  # timm's own defaults for the name (its resolution, its head)
        implied = {k: BACKBONES[canon][k] for k in ("img_size", "num_classes") if k in BACKBONES[canon]}
    fields = {**implied, **timm_kwargs(overrides)}
    if "mlp_ratio" in fields:
        width = fields.get("embed_dim", model_config(canon).embed_dim)
        fields["mlp_dim"] = mlp_dim_for(width, fields.pop("mlp_ratio"))
    for option, value, default in (("img_size", img_size, 224), ("num_classes", num_classes, 1000)):
        fields[option] = value if value is not None else fields.get(option, default)
    return canon, fields
