"""Data for training and evaluation: sources decoded once into uint8 arrays, and
torchvision.transforms.v2 pipelines on top of them.

    from vitlab.data import load_data
    splits = load_data("digits")                  # embedded, no download
    splits = load_data("path/to/imagefolder", val_split=0.1)
    splits.train.images    # (N, H, W, C) uint8, possibly memory-mapped
    splits.val.images      # with val_split: an ImageRows view of the same cache, not a copy

A training run stores a folder for the size it trains at (``load_data(..., plan=...)``): photos keep their
aspect ratio, so ``splits.train.images`` is then a :class:`PackedImages` of several sizes.
"""

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
