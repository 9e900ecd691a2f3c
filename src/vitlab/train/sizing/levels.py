"""The augmentation levels of ``--recipe auto``: how much augmentation and regularisation a run gets.

The rule follows Steiner et al. 2021, "How to train your ViT? Data, Augmentation, and Regularization in
Vision Transformers" (AugReg): the best amount of augmentation and regularisation grows with the number
of epochs and shrinks with the amount of data; on short schedules or large data it hurts. The scale
(:data:`LEVELS`, chosen by :func:`aug_level`):

==========  ==========================  ============  ==================  =====  ======  ===========
level       when (E epochs, n images)   crop scale    RandAugment(N, M)   MixUp  CutMix  other
==========  ==========================  ============  ==================  =====  ======  ===========
minimal     E < 10 (photos: E < 30)     no crop       none                0      0       -
mild        (one below light)           0.8-1 square  none                0      0       -
light       10 <= E < 50                0.5-1         (2, 7)              0      0       SD 0.05
medium      50 <= E < 100               0.35-1        (2, 10)             0.2    0       RE 0.1, SD 0.1
strong      E >= 100                    0.35-1        (2, 15)             0.8    1.0     RE 0.25, SD 0.1
==========  ==========================  ============  ==================  =====  ======  ===========

One level lighter from 10k training images, two from 1M (more data needs less regularisation); "mild" is
reached only by that shift. The "strong" level is the ``small-data`` recipe's DeiT regularisation, which is
meant for 100-300 epochs. The minimal level does not crop at all; the mild one crops squares of 80-100% of
the image (a small change of scale and position). These choices were measured on held-out CIFAR-10
training images (docs/training.md): under 10 epochs even a 0.8-1 crop cost accuracy; on 10k images the
light level lost to no crop at 15 epochs, and at 30 epochs no crop overfit where the 0.8-1 crop did not.

**Photos trained from scratch** (:func:`level_fields` with ``photos``: a folder whose images are stored larger than
the model's input and cropped from it) keep the level's crop and flip and nothing else: no RandAugment, MixUp, CutMix,
erasing or stochastic depth. A random crop of a photo is already a new view of it at the training size; on the
clothing photos the levels' other augmentations lost at every budget measured (docs/training.md, "Photo rows").

**A fine-tune** (``finetune``: a pre-trained ``--init`` model) takes at most :data:`FINETUNE_MOST`: the pre-trained
features need less regularisation than a model learning from nothing, and a fine-tune of the clothing photos lost up
to 19 points to a heavier level. On photos it keeps the crop and flip only under :data:`FINETUNE_WHOLE_FROM` passes
and takes the level whole from there (docs/transfer.md, "The fine-tune's regularisation on photos").
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

__all__ = [
    "FINETUNE_MOST",
    "FINETUNE_WHOLE_FROM",
    "LEVELS",
    "PHOTO_CROP_FROM",
    "PHOTO_OFF",
    "aug_level",
    "level_fields",
    "regularisers",
]

_FIELDS = ("crop_scale", "crop_ratio", "randaugment", "mixup", "cutmix", "random_erasing", "drop_path")
_ANY_RATIO, _SQUARE = (3 / 4, 4 / 3), (1.0, 1.0)
LEVELS: dict[str, dict[str, Any]] = {
    name: dict(zip(_FIELDS, values, strict=True))
    for name, values in (  # crop scale, crop ratio, RandAugment (N, M), MixUp, CutMix, erasing, stochastic depth
        ("minimal", ((1.0, 1.0), _SQUARE, None, 0.0, 0.0, 0.0, 0.0)),  # scale and ratio 1: the whole image
        ("mild", ((0.8, 1.0), _SQUARE, None, 0.0, 0.0, 0.0, 0.0)),
        ("light", ((0.5, 1.0), _ANY_RATIO, (2, 7), 0.0, 0.0, 0.0, 0.05)),
        ("medium", ((0.35, 1.0), _ANY_RATIO, (2, 10), 0.2, 0.0, 0.1, 0.1)),
        ("strong", ((0.35, 1.0), _ANY_RATIO, (2, 15), 0.8, 1.0, 0.25, 0.1)),
    )
}
"""Augmentation and regularisation per level (the fields of :data:`_FIELDS`), lightest first (after AugReg's none /
light / medium / heavy)."""

PHOTO_OFF: dict[str, Any] = {"randaugment": None, "mixup": 0.0, "cutmix": 0.0, "random_erasing": 0.0, "drop_path": 0.0}
"""The fields a level sets that photos leave off (:func:`level_fields`): everything but the crop (and the flip)."""


PHOTO_CROP_FROM = 30
"""The passes from which photos trained from scratch get their level's random crop (under them the minimal level:
the whole image, flipped), where other images get it from 10. On the clothing photos at 64 px, against the same runs
with ``--crop-scale 1,1`` (docs/training.md, "The crop on photos"): under a 1-minute budget (14-16 passes, the light
level) the crop of 0.5-1 cost 6.9 points on the mean of three seeds (2.4 to 10.6 each, at either LR); at 2 minutes
(29-34 passes) it was 1.2 behind on the mean of two (0.0 and 2.3); at 5 minutes (77-84 passes, the medium level's
crop of 0.35-1) 2.6 ahead on one seed. Between 34 and 77 passes it was not measured. Photos packed at their own
aspect ratio (``--pack``) too: under a 1-minute budget, three seeds interleaved, the minimal level against the light
one 42.43% against 42.23% on the centre crop and 49.46% against 45.26% at native aspect ratio, in 291-325 steps
against 255-269 (the whole photo is resized once and kept, and its images make fewer lengths a batch)."""


FINETUNE_MOST = "light"
"""The heaviest level a fine-tune takes (:func:`aug_level` with ``finetune``). On the clothing photos (3,068 training
images, 372 test photos, seed 0, a width-128 ViT pre-trained on CIFAR-10 for 10 minutes, each run alone, the test
top-1 of ``vitlab eval``), the light level against the level its passes call for: 62.10% against 59.14% (medium,
74 passes) in 5 minutes, 66.13% against 47.31% (strong, 121-146 passes) and 63.98% (medium) in 10; without
RandAugment and stochastic depth (the photo rule) 56.99% and 54.03% (docs/transfer.md)."""


FINETUNE_WHOLE_FROM = 40
"""The passes from which a fine-tune of photos takes its level whole (RandAugment(2, 7) and stochastic depth 0.05 at
the light level); under them, the crop and flip only, as photos trained from scratch. On the clothing photos (the
runs of :data:`FINETUNE_MOST`), the light level's crop alone against the level whole: 54.91% against 52.82% at 2
minutes (24-31 passes; four runs against two, seeds 0 and 1; 62.39% against 60.41% on validation), 56.18% against
62.10% at 5 (61-64 passes, seed 0); at 10 minutes (121-146 passes) the whole level 66.13%, the strong level's crop
alone 54.03%. Between them, at 3.5 minutes (44-55 passes, seeds 0 and 1), a tie: the crop alone 57.93%, the whole
level 58.47% (67.01% against 64.08% on validation): the boundary lies there."""


def aug_level(*, epochs: float, n_train: int, photos: bool = False, finetune: bool = False) -> str:
    """The augmentation level (a :data:`LEVELS` key) for ``epochs`` passes over ``n_train`` images (``photos``:
    photos trained from scratch, cropped from :data:`PHOTO_CROP_FROM` passes; ``finetune``: a pre-trained model, at
    most :data:`FINETUNE_MOST`)."""
    i = 0 if epochs < (PHOTO_CROP_FROM if photos else 10) else 2 if epochs < 50 else 3 if epochs < 100 else 4
    i = min(i, list(LEVELS).index(FINETUNE_MOST)) if finetune else i
    i -= (n_train >= 10_000) + (n_train >= 1_000_000)  # from the light level down, one level per shift
    return list(LEVELS)[max(0, i)]


def level_fields(level: str, *, photos: bool = False) -> dict[str, Any]:
    """The recipe fields of augmentation ``level`` (a :data:`LEVELS` key); for ``photos``, its crop with
    :data:`PHOTO_OFF` (see the module's notes)."""
    return {**LEVELS[level], **PHOTO_OFF} if photos else dict(LEVELS[level])


REGULARISERS = (
    ("mixup", "--mixup 0"),
    ("cutmix", "--cutmix 0"),
    ("randaugment", "--randaugment none"),
    ("random_erasing", "--random-erasing 0"),
    ("drop_path", "--drop-path 0"),
)
"""The fields a level sets beyond the crop and flip (:data:`PHOTO_OFF`'s), with the flag that turns each off."""


def regularisers(recipe: Any, *, given: Collection[str] = ()) -> list[str]:
    """The flags that switch off each regulariser ``recipe`` has on (:data:`REGULARISERS`) that this module's rule did
    not choose: what the end of a run's advice proposes when training is much harder than the test
    (:mod:`vitlab.train.persist.advice`). The ``auto`` recipe's regularisers are its level's, chosen for the run's
    passes and data, so only those the user set (``given``: the config's ``recipe_given``) are proposed; a named
    recipe's are all. The advice thus judges a recipe by the rule that chose it and never tells a run to undo it:
    a fine-tune of the clothing photos given the light level's, 62.10% on their test set in 5 minutes, was told to
    drop RandAugment and stochastic depth (its train loss 1.34 against 0.97 on validation, RandAugment's and the
    dropped tokens' work), which scored 56.18% (docs/transfer.md, "The fine-tune's regularisation on photos")."""
    ruled = recipe.name == "auto"
    return [flag for field, flag in REGULARISERS if getattr(recipe, field) and (not ruled or field in given)]
