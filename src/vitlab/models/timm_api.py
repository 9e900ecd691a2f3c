"""timm's conventions for a model's config: ``pretrained_cfg`` (the preprocessing a model is evaluated with, its
classifier's name, a public checkpoint's Hub repo) and timm's names for the pooling (``token``, ``avg``, ``map``).

The timm-named methods themselves (``pretrained_cfg``, ``num_features``, ``reset_classifier``,
``get_intermediate_layers``, ``set_grad_checkpointing``, ``group_matcher`` ...) are methods of
:class:`~vitlab.models.vit.VisionTransformer`, in :mod:`vitlab.models.vit`; they call the functions here, which
the checkpoint readers, the registry and the exported folders use too. Nothing here adds to the paper's model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .config import ViTConfig

__all__ = [
    "EVAL_CROP_MODE",
    "EVAL_INTERPOLATION",
    "TIMM_POOL",
    "FeatureGetter",
    "FeatureInfo",
    "pool_name",
    "pretrained_cfg",
]

EVAL_INTERPOLATION = "bicubic"
"""How vitlab's evaluation resizes (:func:`vitlab.data.eval_transform` and the decode cache: PIL's bicubic, timm's
default for its ViTs), so that timm's transform of ``pretrained_cfg`` gives vitlab's pixels."""
EVAL_CROP_MODE = "center"
"""timm's name for how vitlab's evaluation crops a square input: the shorter side resized to
``floor(img_size / crop_pct)``, then the centre square (a non-square input: ``squash``, both sides resized)."""
_CARRIED = ("hf_hub_id", "license", "tag")
"""``pretrained_cfg`` keys taken from the config's ``extra`` (what is known of a public checkpoint)."""

TIMM_POOL = {"cls": "token", "gap": "avg", "map": "map"}
"""Our pooling names -> timm's ``global_pool`` values. (CCT's sequence pooling, ``seq``, has no timm name.)"""
_POOL_NAMES = (*TIMM_POOL, "seq")


def pool_name(global_pool: str) -> str:
    """Our pooling name for timm's ``global_pool`` (``token`` -> ``cls``, ``avg`` -> ``gap``) or ours."""
    ours = {v: k for k, v in TIMM_POOL.items()}.get(global_pool, global_pool)
    if ours not in _POOL_NAMES:
        names = sorted({*_POOL_NAMES, *TIMM_POOL.values()})
        raise ConfigError(f"global_pool: {global_pool!r} is not one of {', '.join(names)}")
    return ours


def _per_channel(values: tuple[float, ...], in_chans: int) -> tuple[float, ...]:
    """A 3-value mean or std for ``in_chans`` channels, as the evaluation transform normalises: the first
    ``in_chans`` values, the last one repeated for more channels."""
    out = list(values)[:in_chans]
    return tuple(out + [out[-1]] * (in_chans - len(out)))


def pretrained_cfg(cfg: ViTConfig) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` for a model of config ``cfg``: the preprocessing vitlab evaluates it with
    (its ``img_size``, ``mean``, ``std``, ``crop_pct``; bicubic resizing of the shorter side then a centre
    crop, timm's ``center`` mode; both sides for a non-square input, ``squash``), the classifier's name and,
    for a public checkpoint, its Hub repo and licence.
    ``timm.data.resolve_data_config({}, model=model)`` then ``timm.data.create_transform(**config)`` give
    the pixels of vitlab's evaluation."""
    c = cfg.in_chans
    if cfg.stem == "conv":
        first_conv = "patch_embed.convs.0"
    elif cfg.hybrid_layers is None:
        first_conv = "patch_embed.proj"
    else:  # the ResNet's first convolution (only the stem when no stage is kept)
        first_conv = "patch_embed.backbone.stem.conv" if cfg.hybrid_layers else "patch_embed.backbone.conv"
    out: dict[str, Any] = {
        "architecture": cfg.name,
        "input_size": (c, *cfg.img_size),
        "fixed_input_size": False,  # learned position embeddings are resampled to other sizes on the fly
        "interpolation": EVAL_INTERPOLATION,
        "crop_pct": cfg.crop_pct,
        "crop_mode": EVAL_CROP_MODE if cfg.img_size[0] == cfg.img_size[1] else "squash",
        "mean": _per_channel(cfg.mean, c),
        "std": _per_channel(cfg.std, c),
        "num_classes": cfg.num_classes,
        "pool_size": None,
        "first_conv": first_conv,
        "classifier": ("head", "head_dist") if cfg.dist_token else "head",
    }
    if cfg.class_names is not None:
        out["label_names"] = tuple(cfg.class_names)
    out.update({k: cfg.extra[k] for k in _CARRIED if isinstance(cfg.extra.get(k), str)})
    return out


class FeatureInfo:
    """timm's ``feature_info`` of a ``features_only`` model: one dict a block (``module``, ``num_chs``,
    ``reduction``, ``index``); the accessors answer for the chosen blocks, or with ``idx`` for any block by its index
    (timm's semantics: ``module_name(1)`` is ``blocks.1`` whichever blocks were chosen)."""

    def __init__(self, info: list[dict[str, Any]], out_indices: tuple[int, ...]) -> None:
        self.info, self.out_indices = info, out_indices

    def get(self, key: str, idx: int | Sequence[int] | None = None) -> Any:
        if idx is None:
            return [self.info[i][key] for i in self.out_indices]
        if isinstance(idx, (tuple, list)):
            return [self.info[i][key] for i in idx]
        return self.info[idx][key]  # type: ignore[index]

    def get_dicts(self, keys: Sequence[str] | None = None, idx: int | Sequence[int] | None = None) -> Any:
        def pick(d: dict[str, Any]) -> dict[str, Any]:
            return dict(d) if keys is None else {k: d[k] for k in keys}

        if idx is None:
            return [pick(self.info[i]) for i in self.out_indices]
        if isinstance(idx, (tuple, list)):
            return [pick(self.info[i]) for i in idx]
        return pick(self.info[idx])  # type: ignore[index]

    def channels(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("num_chs", idx)

    def reduction(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("reduction", idx)

    def module_name(self, idx: int | Sequence[int] | None = None) -> Any:
        return self.get("module", idx)

    def __getitem__(self, idx: int) -> dict[str, Any]:
        return self.info[idx]

    def __len__(self) -> int:
        return len(self.info)


class FeatureGetter(nn.Module):
    """timm's ``create_model(..., features_only=True, out_indices=...)`` for a ViT (timm's ``FeatureGetterNet``):
    ``forward(x)`` is the list of ``(B, D, rows, cols)`` patch-token maps after the blocks ``out_indices`` names
    (an int: the last that many blocks, timm's default 3; or block indices, negative from the end), which is
    ``model.forward_intermediates(x, indices=..., intermediates_only=True)``; ``feature_info`` gives each map's
    channels, reduction (input pixels a token) and block, as timm's does. The wrapped model is ``self.model``."""

    def __init__(self, model: nn.Module, *, out_indices: int | Sequence[int] = 3) -> None:
        super().__init__()
        depth = len(model.blocks)  # type: ignore[arg-type]
        if isinstance(out_indices, bool) or not isinstance(out_indices, (int, Sequence)):
            raise ConfigError(f"out_indices: expected a number of blocks or block indices, got {out_indices!r}")
        if isinstance(out_indices, int):
            if not 0 < out_indices <= depth:
                raise ConfigError(f"out_indices: {out_indices} is not a number of blocks in 1..{depth}")
            chosen = list(range(depth - out_indices, depth))
        else:
            bad = [i for i in out_indices if isinstance(i, bool) or not isinstance(i, int) or not -depth <= i < depth]
            if bad or not out_indices:
                raise ConfigError(f"out_indices: {list(out_indices)!r} are not block indices in -{depth}..{depth - 1}")
            chosen = [i % depth for i in out_indices]
        cfg: ViTConfig = model.config  # type: ignore[assignment]
        reduction = cfg.img_size[0] // cfg.grid_size[0]
        self.model, self.out_indices = model, tuple(chosen)
        every = [
            {"module": f"blocks.{i}", "num_chs": cfg.embed_dim, "reduction": reduction, "index": i}
            for i in range(depth)
        ]
        self.feature_info = FeatureInfo(every, self.out_indices)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model.forward_intermediates(  # type: ignore[operator]
            x, indices=list(self.out_indices), output_fmt="NCHW", intermediates_only=True
        )
