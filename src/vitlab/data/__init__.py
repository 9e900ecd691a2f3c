"""Data for training and evaluation: sources decoded once into uint8 arrays, and
torchvision.transforms.v2 pipelines on top of them.

    from vitlab.data import load_data
    splits = load_data("digits")                  # embedded, no download
    splits = load_data("path/to/imagefolder", val_split=0.1)
    splits.train.images    # (N, H, W, C) uint8, possibly memory-mapped
    splits.val.images      # with val_split: an ImageRows view of the same cache, not a copy

A training run stores a folder for the size it trains at (``load_data(..., plan=...)``): photos keep their
aspect ratio, so ``splits.train.images`` is then a :class:`PackedImages` of several sizes.

The names below are imported when first used (PEP 562), so that the modules that need no torch (the decoder's
header reads, the resize geometry, a folder's storage) are read without importing it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .rows import ImageRows, PackedImages
    from .sources import DataError, DataSplits, ImageArray, load_data
    from .transforms import ArrayDataset, channel_stats, eval_transform, mix_transform, train_transform

__all__ = [
    "ArrayDataset",
    "DataError",
    "DataSplits",
    "ImageArray",
    "ImageRows",
    "PackedImages",
    "channel_stats",
    "eval_transform",
    "load_data",
    "mix_transform",
    "train_transform",
]

_WHERE = {
    "ImageRows": "rows",
    "PackedImages": "rows",
    "DataError": "sources",
    "DataSplits": "sources",
    "ImageArray": "sources",
    "load_data": "sources",
    "ArrayDataset": "transforms",
    "channel_stats": "transforms",
    "eval_transform": "transforms",
    "mix_transform": "transforms",
    "train_transform": "transforms",
}


def __dir__() -> list[str]:
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
