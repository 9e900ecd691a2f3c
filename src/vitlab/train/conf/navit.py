"""What ``--pack`` (NaViT: Dehghani et al. 2023, "Patch n' Pack") combines with, checked before any work, and the
recipe it trains with: images of different shapes cannot be mixed pixel for pixel (MixUp, CutMix) nor erased in a
tensor of one shape, and the model's own token dropping is done before packing instead
(:mod:`vitlab.train.engine.navit`)."""

from __future__ import annotations

from .options import OptionError, ref
from .recipes import Recipe
from .train_config import TrainConfig

__all__ = ["MAX_SIDE", "PACK_OFF", "check_pack", "pack_recipe"]

MAX_SIDE = 1 << 16
"""The largest image side in pixels an option may ask for (``--img-size``, ``--pack-res``), as a resolution
schedule's sizes (:func:`~vitlab.train.conf.kinds.check_res_schedule`)."""

PACK_OFF = ("mixup", "cutmix", "random_erasing")
"""Recipe fields that act on square batches: refused with ``--pack`` when given, turned off when a recipe chose
them (:func:`pack_recipe`)."""


def check_pack(cfg: TrainConfig) -> None:
    """Refuse what does not combine with ``--pack`` (or its options without it), in one line naming the option."""
    if not cfg.pack:
        for path in ("pack_len", "pack_res"):
            if getattr(cfg, path) is not None:
                raise OptionError(ref(path), " applies to packed training: add ", ref("pack"))
        return
    if cfg.pack_len is not None and cfg.pack_len < 1:
        raise OptionError(ref("pack_len"), f" {cfg.pack_len}: out of range")
    if cfg.pack_res is not None and not 0 < cfg.pack_res[0] <= cfg.pack_res[1] <= MAX_SIDE:
        raise OptionError(ref("pack_res"), f" {cfg.pack_res[0]:g},{cfg.pack_res[1]:g}: expected 0 < LOW <= HIGH <= "
                          f"{MAX_SIDE}")  # fmt: skip
    r = cfg.recipe
    refused = [
        (cfg.objective != "classify", "objective", f" {cfg.objective}", "it predicts the patches of square grids"),
        (cfg.teacher is not None, "teacher", "", "the teacher takes square batches"),
        (cfg.fsdp, "fsdp", "", "not implemented for packed batches yet"),
        (cfg.compile, "compile", "", "packed batches change shape from step to step"),
        (bool(r.res_schedule), "recipe.res_schedule", "", "--pack-res draws each image's resolution instead"),
    ]
    refused += [
        (f in cfg.recipe_given and bool(getattr(r, f)), f"recipe.{f}", f" {getattr(r, f):g}",
         "it acts on a batch of images of one shape")
        for f in PACK_OFF
    ]  # fmt: skip
    for bad, path, shown, why in refused:
        if bad:
            raise OptionError(ref(path), f"{shown} with ", ref("pack"), f": not supported ({why})")


def pack_recipe(cfg: TrainConfig, recipe: Recipe) -> tuple[Recipe, str | None]:
    """``(recipe, line)``: ``recipe`` with what it chose among :data:`PACK_OFF` turned off under ``--pack``, and the
    line that says so (None: nothing to turn off)."""
    off = [f for f in PACK_OFF if getattr(recipe, f)] if cfg.pack else []
    if not off:
        return recipe, None
    line = f"--pack: {', '.join(off)} off (they act on batches of images of one shape)"
    return recipe.replace(**dict.fromkeys(off, 0.0)), line
