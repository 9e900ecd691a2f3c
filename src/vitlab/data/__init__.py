"""Data for training and evaluation: sources decoded once into uint8 arrays, and
torchvision.transforms.v2 pipelines on top of them.

    from vitlab.data import load_data
    splits = load_data("digits")                  # embedded, no download
    splits = load_data("path/to/imagefolder", val_split=0.1)
    splits.train.images    # (N, H, W, C) uint8, possibly memory-mapped
    splits.val.images      # with val_split: an ImageRows view of the same cache, not a copy

A training run stores a folder for the size it trains at (``load_data(..., storage=...)``): photos keep their
aspect ratio, so ``splits.train.images`` is then a :class:`PackedImages` of several sizes.

The names below are imported when first used (PEP 562), so that the modules that need no torch (the decoder's
header reads, the resize geometry, a folder's storage) are read without importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .images.rows import ImageRows, PackedImages
    from .pipeline.transforms import ArrayDataset, channel_stats, eval_transform, mix_transform, train_transform
    from .sources import DataError, DataSource, DataSplits, ImageArray, load_data

__all__ = [
    "ArrayDataset",
    "DataError",
    "DataSource",
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
    "ImageRows": "images.rows",
    "PackedImages": "images.rows",
    "DataError": "sources",
    "DataSource": "sources",
    "DataSplits": "sources",
    "ImageArray": "sources",
    "load_data": "sources",
    "ArrayDataset": "pipeline.transforms",
    "channel_stats": "pipeline.transforms",
    "eval_transform": "pipeline.transforms",
    "mix_transform": "pipeline.transforms",
    "train_transform": "pipeline.transforms",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
