"""Building the named models: each registered name (:mod:`vitlab.models.variants`) has a builder.

``create_model("vit_b16")`` and ``create_model("B/16")`` are the same model.
Other families (hybrid, axial) register their own builders with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..errors import ConfigError, UnknownModelError
from .config import mlp_dim_for
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
    "resolve_name",
    "timm_kwargs",
]

Builder = Callable[..., nn.Module]
_BUILDERS: dict[str, Builder] = {}


def register(name: str, builder: Builder) -> None:
    """Make ``create_model(name, ...)`` call ``builder(num_classes=..., img_size=..., **overrides)``."""
    _BUILDERS[name] = builder
    add_name(name)


def _vit_builder(name: str) -> Builder:
    def build(**overrides: Any) -> VisionTransformer:
        return VisionTransformer(model_config(name, **overrides))

    return build


for _v, _ps in _PATCHES.items():
    for _p in _ps:
        register(f"vit_{_v}{_p}", _vit_builder(f"vit_{_v}{_p}"))
for _name in (*HYBRIDS, *CCTS, *BACKBONES):
    register(_name, _vit_builder(_name))
for _p in (16, 32):  # Axial-ViT (Appendix D.6)
    register(
        f"axial_vit_b{_p}",
        lambda _p=_p, **kw: VisionTransformer(
            model_config(f"vit_b{_p}", **{"name": f"axial_vit_b{_p}", "attention": "axial", **kw})
        ),
    )


def timm_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """timm's ``create_model`` keyword arguments as :class:`ViTConfig` fields: ``global_pool``
    (``token``/``avg`` or ours) -> ``pool``, ``mlp_ratio`` -> ``mlp_dim``; the rest as they are."""
    out = dict(kwargs)
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
    canon = resolve_name(name)
    builder = _BUILDERS.get(canon)
    if builder is None:
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
    return builder(**fields)
