"""THE side rule: the resolution a run trains at, and how a folder of images is stored for it, decided from the
images' sizes before anything is decoded (a folder's headers; tar shards' first samples), so that the decode cache
holds what training needs, no more. One rule for every path: a folder, its shards and ``--pack``, under
``--epochs`` or ``--time-budget``, in ``train`` (masked patch prediction too) and ``finetune``.

The conventions users know from timm and the ViT papers:

- **Photos** (a typical shorter side of at least :data:`PHOTO_SIDE` px) train at :data:`PHOTO_SIZE` px, the
  paper's and timm's input size, or at their own shorter side rounded down to a multiple of 16 when smaller;
  never above that without ``--img-size``. They are evaluated as timm evaluates: the shorter side resized to
  ``img_size / crop_pct`` (:data:`PHOTO_CROP_PCT`), then the centre ``img_size`` square.
- **Small images** (CIFAR's 32 px, digits' 8 px) train at their own size, as they always have; mixed small
  sizes at the median shorter side (:func:`~vitlab.data.images.decode.typical_side`); evaluated whole (crop_pct 1).
- **Photos under a time budget** train at the largest of :data:`BUDGET_SIDES` (up to the size above) at which the
  budget buys at least :data:`BUDGET_PASSES` passes over the training images, estimated from timed training steps
  of the model ``auto`` would train at each size (masked patch prediction's: its ``mpp`` recipe's model there;
  :func:`budget_photo_side`; packed steps cost
  :data:`PACKED_STEP_COST` times as much): a short budget trades resolution for passes, as training at a lower
  resolution first does (Touvron et al. 2019, "Fixing the train-test resolution discrepancy"; Tan & Le 2021,
  EfficientNetV2's progressive learning), and as docs/training.md measures on photos.
- **Photos for a number of epochs** train at the size above; the run states how much faster :data:`FAST_SIDE` px
  would be when it is, since on photos it measured as good for as many epochs (:func:`faster_side_line`).
- **A fine-tune** trains at its ``--init`` model's side (of photos, a Hugging Face folder's at its image
  processor's crop where that is smaller: DINOv2's 224 px, :func:`init_side`); **under a time budget, of photos**,
  at the largest of that side and the smaller :data:`BUDGET_SIDES` (at the model's patch, its position table
  resampled in 2-D, Sec. 3.2) at which the budget buys :data:`FINETUNE_PASSES` passes, timed on the ``--init``
  architecture (:func:`budget_init_side`): the same rule, a pre-trained model's fewer passes (DINOv2's 518 px bought
  one step in 30 s where 224 px bought 71).
- ``--img-size`` (or a recipe's ``img_size``) wins.

Storage (:func:`folder_storage`): training images keep their aspect ratio and whole extent, their shorter side at
most ``img_size / crop_pct`` and at least 1/0.875 of the input (room for random crops), so RandomResizedCrop is
drawn on the original picture; the evaluation split of a ``train/`` + ``val/`` folder is stored resized and
centre-cropped for the evaluation, which then only takes its centre.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._units import duration
from ...data.images.decode import counted_median, too_thin, typical_side
from ...data.images.resize import resize_side
from ...data.images.storage import FolderStorage

if TYPE_CHECKING:
    from ...models.config import ViTConfig
    from ..conf.recipes import Recipe
    from ..conf.train_config import TrainConfig

__all__ = [
    "BUDGET_PASSES",
    "BUDGET_SIDES",
    "CROP_MARGIN",
    "FAST_SIDE",
    "FINETUNE_GRID",
    "FINETUNE_PASSES",
    "INIT_SIDE",
    "PACKED_STEP_COST",
    "PHOTO_CROP_PCT",
    "PHOTO_SIDE",
    "PHOTO_SIZE",
    "budget_init_side",
    "budget_photo_side",
    "faster_side_line",
    "folder_storage",
    "holds_photos",
    "init_side",
    "init_sides",
    "packed_crop_pct",
    "photo_size",
    "sized_recipe",
    "store_side",
    "token_px",
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
:func:`vitlab.train.sizing.recipe.auto_arch`), the others with 16; 96 px (a 6 x 6 grid of patch 16) lost to 64 px at
2 and 5 minutes and is not a step."""
BUDGET_PASSES = 150.0
"""Passes over the training images (as :func:`~vitlab.train.sizing.probe.budget_passes` estimates them) a time
budget must buy at a side for a photo run to train at it: half again above every larger side that lost to 64 px on
the clothing photos, at 2, 5 and 10 minutes, 128 px at 10 minutes with ~90 to ~100 estimated passes among them
(docs/training.md, "Photo rows")."""


def _budget_side(
    sides: list[int], passes: Callable[[int], float], *, enough: float, own: str, what: str
) -> tuple[int, str]:
    """``(side, why)``: the largest of ``sides`` (largest first) at which ``passes(side)`` is at least ``enough``; when
    none is, the smallest. Measured from the largest down, so ``passes`` (a measurement) is called only until one is
    enough. ``own``: why the largest was kept, ``what``: the run the line speaks of."""
    seen: dict[int, float] = {}
    for side in sides:
        seen[side] = passes(side)
        if seen[side] >= enough:
            break
    else:
        side = min(seen)
    top, p = sides[0], seen[side]
    if side == top:
        return side, f"{own}, ~{p:.0f} passes in the budget; --img-size to change"
    n = f"{enough:g}"
    most = f"the largest side with {n} or more" if p >= enough else f"none with {n}"
    return side, f"{what}: ~{seen[top]:.1f} passes at {top} px, ~{p:.1f} at {side} px, {most}; --img-size to change"


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
    own = "photos: the usual ViT input" if top == PHOTO_SIZE else "their own size"
    sides = [top, *(s for s in BUDGET_SIDES if s < top)]
    return _budget_side(sides, passes, enough=BUDGET_PASSES, own=own, what="photos under a time budget")


FINETUNE_PASSES = 24.0
"""Passes over the training images a time budget must buy at a side for a fine-tune of photos to train there
(:func:`budget_init_side`): the fewest a fine-tune of photos was measured with here (the clothing photos at 2
minutes, 24-31 passes: 52.8-56.1% where training from scratch reached 54-56% in 5 minutes; 61-64% from 51-77 passes,
docs/transfer.md). A pre-trained model needs fewer passes than one learning from nothing (:data:`BUDGET_PASSES`);
one that buys fewer than these at its own side makes a handful of steps there (DINOv2 at 518 px: one step in a
30-second budget), so it trains at a smaller side, its position table resampled."""
FINETUNE_GRID = 8
"""The fewest patches across a side a fine-tune's budget rule goes down to: 8 x 8, the grid of the rule's smallest
side for a fresh model (64 px at patch 8; for an ``--init`` model with patch 16, 128 px)."""


def init_side(init: ViTConfig | None, *, photos: bool = True) -> int | None:
    """The side of an ``--init`` model (``init``: its configuration): what a fine-tune without ``--img-size`` trains
    at; None for a model that is not square (its photos are then stored for up to :data:`INIT_SIDE`). On ``photos``,
    a Hugging Face folder whose image processor crops to a smaller side than its table's (DINOv2: 224 px, its config
    518; :attr:`~vitlab.models.ViTConfig.processor_side`) trains at that side, as Hugging Face's pipeline feeds it and
    fine-tunes it, its position table resampled (Sec. 3.2); a value that is not a smaller multiple of its token is
    not one (read from a file: checked, else the model's side). Small images train at the model's side, as before."""
    if init is None or init.img_size[0] != init.img_size[1]:
        return None
    fed = init.processor_side
    return fed if photos and fed is not None else init.img_size[0]


def token_px(init: ViTConfig) -> int:
    """The pixels across one token of ``init``: its patch, times the stem's stride for a hybrid (a ResNet's 16 px
    cell under patch 1), what a side of that model is a multiple of."""
    return init.patch_size * init.stem_stride


def init_sides(side: int, patch: int) -> list[int]:
    """The sides a time-budgeted fine-tune of photos may train at, largest first: its ``--init`` model's ``side``,
    then each of :data:`BUDGET_SIDES` below it rounded down to a multiple of the model's ``patch`` (its position table
    resampled to that grid), none with fewer than :data:`FINETUNE_GRID` patches across."""
    smaller = {s // patch * patch for s in BUDGET_SIDES if s < side}
    return [side, *sorted((s for s in smaller if FINETUNE_GRID * patch <= s < side), reverse=True)]


def budget_init_side(side: int, patch: int, passes: Callable[[int], float]) -> tuple[int, str]:
    """``(side, why)``: the side a time-budgeted fine-tune of photos trains at, by the rule of
    :func:`budget_photo_side` on :func:`init_sides` with :data:`FINETUNE_PASSES`: its ``--init`` model's ``side``
    when the budget buys that many passes there (``passes(side)``), else the largest smaller side that does, else the
    smallest. A model with no smaller side is not measured."""
    sides = init_sides(side, patch)
    own = "the --init model's size"
    if len(sides) == 1:
        return side, own
    return _budget_side(sides, passes, enough=FINETUNE_PASSES, own=own, what="a fine-tune under a time budget")


def store_side(img: int, crop_pct: float = 1.0) -> int:
    """The shorter side (at most) training images are stored with for a model of ``img`` px evaluated with
    ``crop_pct``: what the evaluation resizes to (``floor(img / crop_pct)``, timm's rule) and at least
    :data:`CROP_MARGIN`'s margin over the input; at least 32. Rounded as the evaluation rounds, so that the minimal
    level's view of a stored photo (the evaluation's resize, then the centre) resizes nothing."""
    return max(32, math.floor(img / min(CROP_MARGIN, crop_pct)))


PACKED_STEP_COST = 1.2
"""A packed step (``--pack``) over a square one of the same images and tokens kept, on 2 CPU cores, as a run pays it:
the blocks' compute is 0.92-0.94x since they run the images of each length as a batch on the speed paths, the last
one for the class tokens alone (``benchmarks/bench_packed_attention.py --train-step``, photo shapes uncropped;
1.22-1.33x before, on the plain packed forward), and a run's light crop makes more lengths (more, smaller calls a
block) and packs its batches (docs/training.md, "Packing"): at 1.3, three 1-minute photo runs planned 276, 262 and
257 steps and made 316, 262 and 299 (1.10x on the mean). The probes time a square step dropping the tokens the run
drops and count a packed one as this many (the passes a budget buys at a side, the pace the auto recipe chooses
from)."""


def packed_crop_pct(
    side: int, counts: Mapping[tuple[int, int], int], *, pack_res: tuple[float, float] | None = None
) -> float:
    """The ``crop_pct`` of a packed photo run's centre-crop evaluation (``--pack``), so that its photos are
    evaluated at the scale they trained at, as the square run's are (Touvron et al. 2019, "Fixing the train-test
    resolution discrepancy": the apparent size of the objects at test as at training).

    A square run trains on the photo's shorter side at ``side`` px and evaluates it resized to ``side /``
    :data:`PHOTO_CROP_PCT`; a packed one trains each photo whole at its aspect ratio ``a`` (long / short) within the
    token budget of a ``side`` px square (``--pack-res``: the middle of its range), its shorter side at most ``side
    / sqrt(a)`` (the patch grid rounds down), so its centre crop is resized as much over that: ``crop_pct =
    PHOTO_CROP_PCT * sqrt(a)``, at most 1 (the whole shorter side: a ``side`` crop needs no less), for the typical
    (median, :func:`~vitlab.data.images.decode.counted_median`) aspect ratio of ``counts`` (``(width, height) ->
    count``). 3:4 phone photos: 1.0, the shorter side resized to ``side`` where the square run resizes it to ``side
    / 0.875``. The clothing photos at 64 px, five 1-minute runs of each: the packed models' centre crop read 44.34%
    on the mean at crop_pct 1 against 41.41% at 0.875 (ahead on every seed), the square models' 49.15% against
    53.43% (docs/training.md, "The centre crop of a packed run")."""
    aspect = counted_median(counts, lambda wh: max(wh) / max(1, min(wh)))
    trained = sum(pack_res) / 2 if pack_res is not None else side
    return round(min(1.0, PHOTO_CROP_PCT * math.sqrt(aspect) * side / trained), 3)  # (as a line shows it)


def folder_storage(
    cfg: TrainConfig, counts: Mapping[tuple[int, int], int], *, init: ViTConfig | None = None,
    n_files: int | None = None, passes: Callable[[int, int], float] | None = None, shards: bool = False,
) -> FolderStorage:  # fmt: skip
    """How a run stores (and reads) images whose sizes are ``counts`` (``(width, height) -> count``: a folder's
    training headers, or tar shards' first samples), with the line that says what was chosen and why (see the
    module's notes). A fine-tune without ``--img-size`` trains at its ``--init`` model's side (``init``: its
    configuration, :func:`init_side`; not known: photos are then stored for up to :data:`INIT_SIDE`).
    ``passes(side, n_train)``: the passes a time budget buys at a side
    (:func:`~vitlab.train.sizing.probe.budget_passes`), for photos without a size given (:func:`budget_photo_side`, a
    fine-tune's :func:`budget_init_side`); ``n_files``: the training split's files (default: the sizes counted);
    ``shards``: the images are tar shards (read as they train, decoded as the store would hold them and kept in the
    run's memory, not on disk: the line says so)."""
    pictures = {wh: n for wh, n in counts.items() if not too_thin(*wh)} or dict(counts)
    typical = typical_side(pictures)
    w, h = max((wh for wh in pictures if min(wh) == typical), key=pictures.__getitem__)
    uniform = len(pictures) == 1
    photos = typical >= PHOTO_SIDE
    r = cfg.recipe
    crop_pct = r.crop_pct if r.crop_pct < 1 else PHOTO_CROP_PCT if photos else 1.0
    given = cfg.img_size or r.img_size
    seen = f"images: {w}x{h}" if uniform else f"images: typical {w}x{h} (mixed sizes)"
    n_train, own = n_files or sum(counts.values()), init_side(init, photos=photos)
    if given:
        side = given
        why = "--img-size" if cfg.img_size else f"the {r.name} recipe's size"
    elif cfg.init and own and photos and passes is not None and init is not None:
        side, why = budget_init_side(own, token_px(init), lambda s: passes(s, n_train))
    elif cfg.init:
        side, why = own, "the --init model's size"
        if init is not None and own is not None and own != init.img_size[0]:  # (a processor's crop: init_side)
            why = "the --init model's image processor's crop, as Hugging Face feeds it"
    elif photos and passes is not None:
        side, why = budget_photo_side(typical, lambda s: passes(s, n_train))
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
    if cfg.pack_res is not None:  # an image at --pack-res HIGH's budget has a shorter side of at most HIGH
        keep = max(keep, math.ceil(cfg.pack_res[1]))
    scale = ""
    if cfg.pack and photos and side is not None and r.crop_pct >= 1:
        crop_pct = packed_crop_pct(side, pictures, pack_res=cfg.pack_res)
        scale = " (packed whole: the scale they train at)"
    square = size is not None and size[0] == size[1]
    eval_side = resize_side(size[0], crop_pct) if square and size and (photos or not uniform) else None
    if cfg.pack:  # evaluated at their own aspect ratio too: stored whole, as the training images
        eval_side = None
    stored = f"stored with the shorter side at most {keep} px, aspect ratio kept"
    if uniform and min(w, h) <= keep:
        stored = "stored as they are"
    if shards:
        stored = f"read from the shards as they train, {stored.split(', ')[0]} in memory (nothing on disk)"
    how = "resize shorter side + centre crop for evaluation" if square else "resized to the input for evaluation"
    if size is not None and size[0] != size[1]:  # each side named, as the model's size is (vitlab._text.size_px)
        seen = f"images: width {w} x height {h}"
    line = f"{seen} -> {to}; {stored}; {how}, crop_pct {crop_pct:g}{scale}"
    return FolderStorage(size=size, store_side=keep, eval_side=eval_side, crop_pct=crop_pct, typical=typical, line=line)


def holds_photos(data: Any) -> bool:
    """Whether ``data`` (the run's splits: a folder, or tar shards) holds photos: the typical shorter side its
    storage was chosen from (:func:`folder_storage`) is at least :data:`PHOTO_SIDE` px, so that the run crops its
    training images from larger ones (the built-in data sets have no storage: they are not)."""
    stored = getattr(data, "storage", None)
    return stored is not None and stored.typical >= PHOTO_SIDE


def sized_recipe(recipe: Recipe, cfg: TrainConfig, data: Any) -> Recipe:
    """``recipe`` with the size and evaluation crop the data's storage was chosen for (``data.storage``), so that the
    model, the evaluation, the saved model's ``crop_pct`` and a resumed run all follow them: the ``crop_pct``
    always, the ``img_size`` when chosen for photos (small images keep the data's own size, as the recipe's
    ``None`` says). Unchanged without a storage (the built-in data sets)."""
    stored = getattr(data, "storage", None)
    if stored is None:
        return recipe
    changes: dict[str, Any] = {}
    if stored.crop_pct != recipe.crop_pct:
        changes["crop_pct"] = stored.crop_pct
    if not cfg.img_size and not recipe.img_size and stored.size is not None and holds_photos(data):
        changes["img_size"] = stored.size[0]
    return recipe.replace(**changes) if changes else recipe


FAST_SIDE = 64
"""The side a photo run for a number of epochs is told about when it is much faster (:func:`faster_side_line`): on
photos it measured as good as 224 px for the same epochs (clothing photos, 30 epochs: 53.25% against 52.8%, at a
third of the time; a 3,670-image flower folder, 5 epochs: 65.2% against 64.95%, 79 s against 385 s;
docs/training.md, "Photo rows")."""
FAST_EPOCHS = 30
"""The most epochs at which :data:`FAST_SIDE` was measured against the larger side: beyond, nothing is said."""
MUCH_FASTER = 0.5
"""A side is "much faster" when its run is estimated at no more than this share of the chosen side's."""


def faster_side_line(*, side: int, epochs: int, seconds: float, fast_seconds: float) -> str | None:
    """For a photo run of ``epochs`` epochs at ``side`` px estimated at ``seconds``: the line proposing
    :data:`FAST_SIDE` px when it is estimated at ``fast_seconds`` <= :data:`MUCH_FASTER` x that, and measured as
    good for as many epochs (at most :data:`FAST_EPOCHS`); else None."""
    if side <= FAST_SIDE or epochs > FAST_EPOCHS or fast_seconds > MUCH_FASTER * seconds:
        return None
    return (
        f"note: --img-size {FAST_SIDE} would take ~{duration(fast_seconds)} instead of ~{duration(seconds)} for these "
        f"{epochs} epochs; on photos it measured as good for up to {FAST_EPOCHS} epochs (docs/training.md)"
    )
