"""The resolution a run trains at, and how a folder of images is stored for it, decided from the files'
headers before anything is decoded (so that the decode cache holds what training needs, no more).

The conventions users know from timm and the ViT papers:

- **Photos** (a typical shorter side of at least :data:`PHOTO_SIDE` px) train at :data:`PHOTO_SIZE` px, the
  paper's and timm's input size, or at their own shorter side rounded down to a multiple of 16 when smaller;
  never above that without ``--img-size``. They are evaluated as timm evaluates: the shorter side resized to
  ``img_size / crop_pct`` (:data:`PHOTO_CROP_PCT`), then the centre ``img_size`` square.
- **Small images** (CIFAR's 32 px, digits' 8 px) train at their own size, as they always have; mixed small
  sizes at the median shorter side (:func:`~vitlab.data.decode.typical_side`); evaluated whole (crop_pct 1).
- **Photos under a time budget** train at the largest of :data:`BUDGET_SIDES` (up to the size above) at which the
  budget buys at least :data:`BUDGET_PASSES` passes over the training images, estimated from timed training steps
  of the model ``auto`` would train at each size (:func:`budget_photo_side`): a short budget trades resolution for
  passes, as training at a lower resolution first does (Touvron et al. 2019, "Fixing the train-test resolution
  discrepancy"; Tan & Le 2021, EfficientNetV2's progressive learning), and as docs/training.md measures on photos.
- ``--img-size`` (or a recipe's ``img_size``) wins; an ``--init`` model without one trains at its own size.

Storage (:func:`vitlab.train.engine.data.folder_plan`): training images keep their aspect ratio and whole extent,
their shorter side at most ``img_size / crop_pct`` and at least 1/0.875 of the input (room for random crops),
so RandomResizedCrop is drawn on the original picture; the evaluation split of a ``train/`` + ``val/`` folder
is stored resized and centre-cropped for the evaluation, which then only takes its centre.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "BUDGET_PASSES",
    "BUDGET_SIDES",
    "CROP_MARGIN",
    "INIT_SIDE",
    "PHOTO_CROP_PCT",
    "PHOTO_SIDE",
    "PHOTO_SIZE",
    "budget_photo_side",
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


BUDGET_SIDES = (224, 160, 128, 64)
"""The sides a time-budgeted photo run may train at without ``--img-size``, largest first: 224 px and the smaller
sides measured against it on photos (docs/training.md, "Photo rows"). 64 px trains with patch 8 (an 8 x 8 grid,
:func:`vitlab.train.spec.fitting.auto_arch`), the others with 16; 96 px (a 6 x 6 grid of patch 16) lost to 64 px at
2 and 5 minutes and is not a step."""
BUDGET_PASSES = 150.0
"""Passes over the training images (as :func:`~vitlab.train.engine.calibrate.budget_passes` estimates them) a time
budget must buy at a side for a photo run to train at it: half again above every larger side that lost to 64 px on
the clothing photos, at 2, 5 and 10 minutes, 128 px at 10 minutes with ~90 to ~100 estimated passes among them
(docs/training.md, "Photo rows")."""


def budget_photo_side(typical: int, passes: Callable[[int], float]) -> tuple[int, str]:
    """``(side, why)``: the side a time-budgeted photo run of ``typical`` shorter side trains at, the largest of
    :data:`BUDGET_SIDES` up to :func:`photo_size` at which ``passes(side)`` (the passes the budget buys there) is at
    least :data:`BUDGET_PASSES`; when none is, the smallest. ``why`` says so for the run's first line. Sides are
    tried from the largest down, so ``passes`` (a measurement) is called only until one is enough.

    Below the threshold the smallest side, not the one with the most passes: 128 px with patch 16 (64 tokens) costs
    about what 64 px with patch 8 does, so "the most passes" would be decided by the timing's noise, and every
    larger side measured below the threshold lost to 64 px, 96 px with more passes among them (docs/training.md,
    "Photo rows")."""
    top = photo_size(typical)
    seen: dict[int, float] = {}
    for side in [top, *(s for s in BUDGET_SIDES if s < top)]:
        seen[side] = passes(side)
        if seen[side] >= BUDGET_PASSES:
            break
    else:
        side = min(seen)
    p = seen[side]
    if side == top:
        own = "photos: the usual ViT input" if top == PHOTO_SIZE else "their own size"
        return side, f"{own}, ~{p:.0f} passes in the budget; --img-size to change"
    n = f"{BUDGET_PASSES:g}"
    enough = f"the largest side with {n} or more" if p >= BUDGET_PASSES else f"none with {n}"
    return side, (
        f"photos under a time budget: ~{seen[top]:.1f} passes at {top} px, ~{p:.1f} at {side} px, {enough}; "
        "--img-size to change"
    )


def store_side(img: int, crop_pct: float = 1.0) -> int:
    """The shorter side (at most) training images are stored with for a model of ``img`` px evaluated with
    ``crop_pct``: what the evaluation resizes to (``floor(img / crop_pct)``, timm's rule) and at least
    :data:`CROP_MARGIN`'s margin over the input; at least 32. Rounded as the evaluation rounds, so that the minimal
    level's view of a stored photo (the evaluation's resize, then the centre) resizes nothing."""
    return max(32, math.floor(img / min(CROP_MARGIN, crop_pct)))


def holds_photos(data: Any) -> bool:
    """Whether ``data`` (the run's splits) is a folder of photos: its plan's typical shorter side is at least
    :data:`PHOTO_SIDE` px, so that the run stores them larger than it trains and crops from them (built-in data sets
    and tar shards have no plan: they are not)."""
    plan = getattr(data, "plan", None)
    return plan is not None and plan.typical >= PHOTO_SIDE


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
    if not cfg.img_size and not r.img_size and plan.size is not None and holds_photos(data):
        changes["img_size"] = plan.size[0]
    return dataclasses.replace(cfg, recipe=r.replace(**changes)) if changes else cfg
