"""Moved to :mod:`vitlab.train.spec.fitting` (this name goes when every caller has moved)."""

from .spec.fitting import (
    LEVELS,
    MODELS,
    PLAIN,
    _patch_for,
    aug_level,
    auto_arch,
    auto_batch,
    auto_recipe,
    fit_recipe_to_data,
)

__all__ = [
    "LEVELS",
    "MODELS",
    "PLAIN",
    "_patch_for",
    "aug_level",
    "auto_arch",
    "auto_batch",
    "auto_recipe",
    "fit_recipe_to_data",
]
