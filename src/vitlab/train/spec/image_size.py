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

Storage (:func:`vitlab.train.engine.data.folder_plan`): training images keep their aspect ratio and whole extent,
their shorter side at most ``img_size / crop_pct`` and at least 1/0.875 of the input (room for random crops),
so RandomResizedCrop is drawn on the original picture; the evaluation split of a ``train/`` + ``val/`` folder
is stored resized and centre-cropped for the evaluation, which then only takes its centre.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = [
    "CROP_MARGIN",
    "INIT_SIDE",
    "PHOTO_CROP_PCT",
    "PHOTO_SIDE",
    "PHOTO_SIZE",
    "fit_size_to_data",
    "photo_size",
    "store_side",
]

PHOTO_SIDE = 160
"""A typical shorter side (px) from which a folder holds photos: trained at :data:`PHOTO_SIZE`, patch 16."""
PHOTO_SIZE = 224
"""The training resolution of photos without ``--img-size`` (the paper's ImageNet size, timm's default)."""
PHOTO_CROP_PCT = 0.875
"""timm's ``crop_pct``: photos are evaluated on the centre 87.5% of the resized shorter side."""
CROP_MARGIN = 0.875
"""Training images are stored with their shorter side at least ``img_size / 0.875`` (~1.14x): room for crops."""
INIT_SIDE = 384
"""Where a fine-tune's training size is not known before the data is decoded (an ``--init`` model that is not
square), photos are stored for up to this (the paper's fine-tuning resolution), so that any fine-tuning size up to
it has the pixels it needs; otherwise for the ``--init`` model's own size."""


def photo_size(typical: int) -> int:
    """The training side for photos of ``typical`` shorter side: :data:`PHOTO_SIZE`, or the typical side
    rounded down to a multiple of 16 (the patch) when smaller."""
    return min(PHOTO_SIZE, max(16, typical // 16 * 16))


def store_side(img: int, crop_pct: float = 1.0) -> int:
    """The shorter side (at most) training images are stored with for a model of ``img`` px evaluated with
    ``crop_pct``: what the evaluation resizes to (``img / crop_pct``) and at least :data:`CROP_MARGIN`'s margin
    over the input; at least 32."""
    return max(32, math.ceil(img / min(CROP_MARGIN, crop_pct)))


def fit_size_to_data(cfg: Any, data: Any) -> Any:
    """``cfg`` with the size and evaluation crop its folder was stored for (``data.plan``) in its recipe, so
    that the model, the evaluation, the saved model's ``crop_pct`` and a resumed run all follow them: the
    ``crop_pct`` always, the ``img_size`` when chosen for photos (small images keep the data's own size, as the
    recipe's ``None`` says). Unchanged without a plan (built-in data sets, tar shards)."""
    plan = getattr(data, "plan", None)
    if plan is None:
        return cfg
    r, changes = cfg.recipe, {}
    if plan.crop_pct != r.crop_pct:
        changes["crop_pct"] = plan.crop_pct
    if not cfg.img_size and not r.img_size and plan.size is not None and plan.typical >= PHOTO_SIDE:
        changes["img_size"] = plan.size[0]
    return dataclasses.replace(cfg, recipe=r.replace(**changes)) if changes else cfg
