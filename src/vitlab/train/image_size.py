"""The resolution a run trains at, and how a folder of images is stored for it, decided from the files'
headers before anything is decoded (so that the decode cache holds what training needs, no more).

The conventions users know from timm and the ViT papers:

- **Photos** (a typical shorter side of at least :data:`PHOTO_SIDE` px) train at :data:`PHOTO_SIZE` px, the
  paper's and timm's input size, or at their own shorter side rounded down to a multiple of 16 when smaller;
  never above that without ``--img-size``. They are evaluated as timm evaluates: the shorter side resized to
  ``img_size / crop_pct`` (:data:`PHOTO_CROP_PCT`), then the centre ``img_size`` square.
- **Small images** (CIFAR's 32 px, digits' 8 px) train at their own size, as they always have; mixed small
  sizes at the median shorter side (:func:`~vitlab.data.decode.typical_side`); evaluated whole (crop_pct 1).
- ``--img-size`` (or a recipe's ``img_size``) wins; an ``--init`` model without one trains at its own size.

Storage (:class:`~vitlab.data.sources.FolderPlan`): training images keep their aspect ratio and whole extent,
their shorter side at most ``img_size / crop_pct`` and at least 1/0.875 of the input (room for random crops),
so RandomResizedCrop is drawn on the original picture; the evaluation split of a ``train/`` + ``val/`` folder
is stored resized and centre-cropped for the evaluation, which then only takes its centre.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..data.decode import too_thin, typical_side
from ..data.sources import FolderPlan
from ..data.transforms import resize_side
from .spec.image_size import (
    CROP_MARGIN,
    INIT_SIDE,
    PHOTO_CROP_PCT,
    PHOTO_SIDE,
    PHOTO_SIZE,
    fit_size_to_data,
    photo_size,
    store_side,
)

__all__ = [
    "INIT_SIDE",
    "PHOTO_CROP_PCT",
    "PHOTO_SIDE",
    "PHOTO_SIZE",
    "fit_size_to_data",
    "folder_plan",
    "photo_size",
    "store_side",
]


def folder_plan(cfg: Any, counts: Mapping[tuple[int, int], int]) -> FolderPlan:
    """How a run (``cfg``, a :class:`~vitlab.train.TrainConfig`) stores a folder whose training split's
    headers give ``counts`` (``(width, height) -> count``; see the module's notes), with the line that says
    what was chosen and why."""
    pictures = {wh: n for wh, n in counts.items() if not too_thin(*wh)} or dict(counts)
    typical = typical_side(pictures)
    w, h = max((wh for wh in pictures if min(wh) == typical), key=pictures.__getitem__)
    uniform = len(pictures) == 1
    photos = typical >= PHOTO_SIDE
    r = cfg.recipe
    crop_pct = r.crop_pct if r.crop_pct < 1 else PHOTO_CROP_PCT if photos else 1.0
    given = cfg.img_size or r.img_size
    seen = f"images: {w}x{h}" if uniform else f"images: typical {w}x{h} (mixed sizes)"
    if given:
        side = given
        why = "--img-size" if cfg.img_size else f"the {r.name} recipe's size"
    elif cfg.init:
        side, why = None, ""
    elif photos:
        side = photo_size(typical)
        why = "photos: the usual ViT input; --img-size to change" if side == PHOTO_SIZE else "their own size"
    else:
        side, why = None, ""
    if side is not None:
        size: tuple[int, int] | None = (side, side)
        keep = store_side(side, crop_pct)
        to = f"training at {side} px ({why})"
    elif cfg.init:
        size, keep = None, math.ceil(INIT_SIDE / CROP_MARGIN) if photos else store_side(typical)
        to = "training at the --init model's size"
    else:  # small images: their own size, or the median shorter side of mixed sizes
        size = (h, w) if uniform else (typical, typical)
        keep = store_side(typical)
        to = "training at their own size" if uniform else f"training at {typical} px (the median shorter side)"
    square = size is not None and size[0] == size[1]
    eval_side = resize_side(size[0], crop_pct) if square and size and (photos or not uniform) else None
    stored = f"stored with the shorter side at most {keep} px, aspect ratio kept"
    if uniform and min(w, h) <= keep:
        stored = "stored as they are"
    how = "resize shorter side + centre crop for evaluation" if square else "resized to the input for evaluation"
    line = f"{seen} -> {to}; {stored}; {how}, crop_pct {crop_pct:g}"
    return FolderPlan(size=size, store_side=keep, eval_side=eval_side, crop_pct=crop_pct, typical=typical, line=line)
