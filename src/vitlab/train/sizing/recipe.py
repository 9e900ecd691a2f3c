"""The recipe rules (no torch): ``--recipe auto`` fitted to the data and the budget, the default for data a user passes
(:func:`classify_recipe`), the paper's ``finetune`` recipe's batch fitted to the data, and masked patch prediction's
patch and batch (:func:`mpp_recipe`). Each returns the recipe the run trains with and the line that says what was
chosen; the run's config is never changed (:class:`~vitlab.train.sizing.Sizing` holds the result).

The augmentation level follows the passes and the data size (:mod:`.levels`, after AugReg: Steiner et
al. 2021); every level: horizontal flip 0.5, label smoothing 0.1, weight decay 0.05, cosine decay; AdamW, or with a
``--time-budget`` on small images Muon for the encoder's matrices (:data:`BUDGET_OPTIMIZER`).

The batch is at most 1/16 of the training set (a power of two, 8 to 128), so that small data gets enough
optimiser steps per epoch; the AdamW LR at batch 128 is 2e-3 under 10 epochs (the LR this project's CIFAR-10
sweep chose for short schedules, docs/cifar10.md) and 1e-3 from 10 (at 30 epochs on 10k images 2e-3 overfit,
docs/training.md), scaled by the square root of the batch (the usual rule for Adam-type optimisers); the
warmup is 10% of the planned steps (5% from 5,000 steps).
Without ``--model`` the model is sized for the budget (:data:`MODELS`, by the number of images the run
will see) with a patch size that gives about an 8 x 8 grid of tokens (photos: the paper's 16 at 224 px,
:mod:`vitlab.train.sizing.side` picks their resolution), the paper's class token and fixed
2-D sine-cosine position embeddings (:data:`PLAIN`) instead of learned ones: Beyer et al. 2022 ("Better
plain ViT baselines for ImageNet-1k") and this project's CIFAR-10 sweep (docs/cifar10.md) found them
better when data or schedules are small; nothing has to learn the grid. docs/training.md has the
measurements behind keeping the class token. A ``--time-budget`` run also drops half the patch tokens in
training (:data:`BUDGET_TOKEN_DROP`), which buys it about twice the steps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..._text import size_px
from ..._units import counted
from ...models.config import ViTConfig
from ..conf.recipes import RECIPES, Recipe
from ..conf.train_config import run_recipe
from .levels import FINETUNE_MOST, FINETUNE_WHOLE_FROM, LEVELS, PHOTO_CROP_FROM, aug_level, level_fields
from .pace import Pace, save_seconds, steps_in_budget, train_step_macs
from .side import PHOTO_SIDE

__all__ = [
    "BUDGET_OPTIMIZER",
    "BUDGET_TOKEN_DROP",
    "COMMON_FIELDS",
    "LEVELS",
    "MACS_PER_S",
    "MODELS",
    "PLAIN",
    "aug_level",
    "auto_arch",
    "auto_batch",
    "auto_reason",
    "auto_recipe",
    "budget_token_drop",
    "classify_recipe",
    "estimated_images",
    "forward_macs",
    "mpp_recipe",
    "paced_level",
]

COMMON_FIELDS = {"hflip": 0.5, "label_smoothing": 0.1, "weight_decay": 0.05}
"""The fields every auto recipe sets, a fresh run's and a fine-tune's (:mod:`.finetune`) alike."""

MODELS: list[tuple[str, int, dict[str, int]]] = [
    ("tiny", 0, {"embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_dim": 256}),
    ("small", 1_000_000, {"embed_dim": 192, "depth": 6, "num_heads": 3, "mlp_dim": 384}),
    ("base", 2_500_000, {"embed_dim": 192, "depth": 9, "num_heads": 12, "mlp_dim": 384}),
]
"""``(name, images seen from which it is chosen, ViT fields)``; "base" is the ``small-data`` recipe's
CIFAR model (the SPT/LSA paper's plain-ViT baseline), the others are its shallower, narrower versions.
"small" starts at 1M images seen: at 300k (10k images, 30 epochs) it did far worse with the light level
than "tiny" with the minimal one (docs/training.md; the two changes were not measured apart)."""

PLAIN: dict[str, Any] = {"posemb": "sincos2d"}
"""The position embeddings of every model ``auto`` picks (``--posemb learn`` overrides them)."""

BUDGET_TOKEN_DROP = 0.5
"""The share of patch tokens dropped in training (PatchDropout, Liu et al. 2022; FLIP, Li et al. 2023) when the
run has a ``--time-budget``: each step then costs about half, so the budget buys about twice the steps, which
outweighs the noisier steps on short budgets (docs/speedrun.md). Only for grids of at least 16 tokens."""


def budget_token_drop(img_size: tuple[int, int], patch: int) -> float:
    """The share of patch tokens a ``--time-budget`` run drops when the recipe does not say:
    :data:`BUDGET_TOKEN_DROP` on a grid of at least 16 tokens (a side the patch does not divide is padded, so its
    partial patches count), else none."""
    grid = math.ceil(img_size[0] / patch) * math.ceil(img_size[1] / patch)
    return BUDGET_TOKEN_DROP if grid >= 16 else 0.0


BUDGET_OPTIMIZER = "muon"
"""The optimizer of a ``--time-budget`` run on small images (not photos): Muon (Jordan et al. 2024, as in
airbench94_muon) for the encoder blocks' matrices, AdamW for every other weight, at the AdamW LR
(:func:`vitlab.train.engine.optim.build_optimizer`); it won both CIFAR-10 speedrun tracks at 5 and 20 minutes and
through this recipe (docs/speedrun.md, docs/training.md). AdamW stays where Muon does not go
(:func:`~vitlab.train.conf.train_config.muon_refusal`: ``--fsdp``, layer-wise LR decay, ``--freeze``)."""

MACS_PER_S = {"cpu": 1e10, "cuda": 2e12}
"""A rough training throughput (multiply-accumulates per second) for a ``--time-budget`` run that no probe measured
before its recipe is chosen (several processes, which would each measure their own): only the model size and the
augmentation level depend on it, the run's own plan is measured. Runs on a folder or its tar shards, fresh or
fine-tuning (:mod:`.finetune`), choose from a measured :class:`~.pace.Pace`."""


def estimated_images(time_budget: float, *, image_step_macs: float, device_type: str) -> float:
    """Training images a ``time_budget`` of seconds buys at :data:`MACS_PER_S` when a step costs ``image_step_macs``
    an image (:func:`~.pace.train_step_macs` of one image): the estimate of a budget no probe measured."""
    return time_budget * MACS_PER_S.get(device_type, MACS_PER_S["cpu"]) / image_step_macs


def auto_batch(n_train: int, *, cap: int = 128) -> int:
    """At most 1/16 of the training set, a power of two from 8 to ``cap`` (and never above ``n_train``)."""
    b = 2 ** int(math.log2(max(1, n_train // 16)))
    return max(1, min(n_train, cap, max(8, b)))


_PATCHES = (32, 16, 14, 8, 7, 4, 2, 1)


def _patch_for(img: tuple[int, int], *, photos: bool = False) -> int:
    """The patch size: for ``photos`` from :data:`~vitlab.train.sizing.side.PHOTO_SIDE` px the paper's 16 (ViT-B/16,
    196 tokens at 224 px); otherwise the one giving a grid of tokens closest to 8 x 8 (ties: the larger patch)
    among those that divide the image, or, when none of them gives 6 to 10 tokens a side (odd sides: only
    patch 1 divides them), the closest of all, with the model padding the image to a multiple of it
    (``dynamic_img_pad``, see :func:`auto_arch`)."""
    if photos and min(img) >= PHOTO_SIDE:
        return 16
    ok = [p for p in _PATCHES if img[0] % p == 0 and img[1] % p == 0]
    best = min(ok, key=lambda p: (abs(min(img) // p - 8), -p))
    if abs(min(img) // best - 8) <= 2:
        return best
    return min(_PATCHES, key=lambda p: (abs(min(img) // p - 8), -p))


def forward_macs(arch: dict[str, int], img: tuple[int, int], in_chans: int, *, token_drop: float = 0.0) -> float:
    """Multiply-accumulates of one forward pass (blocks, attention and patch embedding); the blocks see the
    ``1 - token_drop`` share of the patch tokens that are kept."""
    p, d, n = arch["patch_size"], arch["embed_dim"], arch["depth"]
    patches = math.ceil(img[0] / p) * math.ceil(img[1] / p)
    t = round(patches * (1 - token_drop)) + 1
    return n * (t * (4 * d * d + 2 * d * arch["mlp_dim"]) + 2 * t * t * d) + patches * d * p * p * in_chans


def auto_arch(
    *,
    img_size: tuple[int, int],
    in_chans: int,
    images_seen: float | None = None,
    time_budget: float | None = None,
    device_type: str = "cpu",
    photos: bool = False,
) -> tuple[str, dict[str, Any]]:
    """``(name, ViT fields)`` of the :data:`MODELS` entry for the budget: by ``images_seen`` (epochs x images),
    or for a ``time_budget`` in seconds the largest model that sees its share of images in it at an
    estimated throughput (:data:`MACS_PER_S`). The patch size is :func:`_patch_for`'s (``photos``: the data
    are photos); a patch that does not divide the image adds ``dynamic_img_pad``."""
    patch = _patch_for(img_size, photos=photos)
    pad = {"dynamic_img_pad": True} if img_size[0] % patch or img_size[1] % patch else {}
    for name, least, fields in reversed(MODELS):
        arch = {"patch_size": patch, **fields, **pad}
        seen = images_seen
        if time_budget is not None:
            step = train_step_macs(forward_macs(arch, img_size, in_chans), 1)
            seen = estimated_images(time_budget, image_step_macs=step, device_type=device_type)
        if seen is not None and seen >= least:
            return name, {**arch, **PLAIN}
    return MODELS[0][0], {"patch_size": patch, **MODELS[0][2], **pad, **PLAIN}


def auto_recipe(
    *,
    n_train: int,
    img_size: tuple[int, int],
    num_classes: int,
    in_chans: int = 3,
    epochs: int | None = None,
    time_budget: float | None = None,
    batch_size: int | None = None,
    token_drop: float | None = None,
    device_type: str = "cpu",
    photos: bool = False,
    photo_data: bool = False,
    pace: Pace | None = None,
) -> tuple[Recipe, str]:
    """The resolved ``auto`` recipe for ``n_train`` images of ``img_size`` in ``num_classes`` classes,
    trained for ``epochs`` or ``time_budget`` seconds, and one line saying what it chose and why.

    ``batch_size``: the user's (else :func:`auto_batch`); ``token_drop``: the user's (else
    :data:`BUDGET_TOKEN_DROP` with a ``time_budget``, none without); ``photos``: the input is photo-sized
    (the patch, :func:`_patch_for`); ``photo_data``: the images are photos the run crops from (the level's crop
    and flip only, :func:`~.levels.level_fields`; a crop only from :data:`~.levels.PHOTO_CROP_FROM` passes, square or
    packed); ``pace``: what a probe measured on the data (with a ``time_budget``, the model,
    level and passes are chosen from it, :func:`_by_pace`; without one, from :data:`MACS_PER_S`)."""
    batch = batch_size or auto_batch(n_train)
    steps_per_epoch = max(1, n_train // batch)
    level = None
    if time_budget is not None and pace is not None:
        model, arch, token_drop, level, steps, per_step = _by_pace(
            pace, time_budget=time_budget, n_train=n_train, img_size=img_size, in_chans=in_chans, batch=batch,
            token_drop=token_drop, photos=photos, photo_data=photo_data,
        )  # fmt: skip
        how = f"~{counted(steps, 'step')} of {per_step * 1000:.0f} ms in {time_budget:.0f} s (measured: {pace.probe})"
    elif time_budget is not None:
        model, arch = auto_arch(
            img_size=img_size, in_chans=in_chans, time_budget=time_budget, device_type=device_type, photos=photos
        )
        if token_drop is None:
            token_drop = budget_token_drop(img_size, arch["patch_size"])
        macs = forward_macs(arch, img_size, in_chans, token_drop=token_drop)
        seen = estimated_images(time_budget, image_step_macs=train_step_macs(macs, 1), device_type=device_type)
        steps = max(1, int(seen / batch))
        how = f"~{counted(steps, 'step')} (estimated for {time_budget:.0f} s on {device_type})"
    else:
        token_drop = token_drop or 0.0
        epochs = epochs or RECIPES["auto"].epochs
        steps = epochs * steps_per_epoch
        model, arch = auto_arch(img_size=img_size, in_chans=in_chans, images_seen=steps * batch, photos=photos)
        how = f"{counted(steps, 'step')} ({counted(epochs, 'epoch')} of {steps_per_epoch})"
    passes = epochs if time_budget is None else steps * batch / n_train
    level = level or aug_level(epochs=passes, n_train=n_train, photos=photo_data)
    aug = level_fields(level, photos=photo_data)
    warm = 0.1 if steps < 5000 else 0.05
    lr = (2e-3 if passes < 10 else 1e-3) * math.sqrt(batch / 128)
    small = time_budget is not None and not (photos or photo_data)
    recipe = dataclasses.replace(
        RECIPES["auto"],
        arch=arch,
        batch_size=batch,
        base_batch=batch,
        lr=lr,
        warmup_steps=0,
        warmup_epochs=0.0,
        warmup_fraction=warm,
        token_drop=token_drop,
        optimizer=BUDGET_OPTIMIZER if small else "adamw",
        **COMMON_FIELDS,
        **aug,
    )
    head = f"auto: {how} on {n_train:,} images ({size_px(img_size)}, {num_classes} classes)"
    plain = aug_level(epochs=passes, n_train=0, photos=photo_data)
    reason = head + auto_reason(recipe, level=level, plain=plain, passes=passes, n_train=n_train, model=model,
                                photos=photo_data)  # fmt: skip
    return recipe, reason


def _by_pace(
    pace: Pace, *, time_budget: float, n_train: int, img_size: tuple[int, int], in_chans: int, batch: int,
    token_drop: float | None, photos: bool, photo_data: bool = False,
) -> tuple[str, dict[str, Any], float, str, int, float]:  # fmt: skip
    """``(model, ViT fields, token drop, level, steps, seconds a step)`` for a time budget, from a measured pace:
    the steps are counted as the run's plan counts them (:func:`~.pace.steps_in_budget`, with each epoch's evaluation
    and saving), each candidate model's step scaled from the probed one by its multiply-accumulates, with its level's
    augmentation. The level is the heaviest whose own cost still leaves the passes it asks for (a level's
    augmentation slows the steps, so fewer passes might ask for a lighter one), the model the largest whose
    images seen reach its :data:`MODELS` threshold, else the smallest."""
    left = pace.budget_left(time_budget)
    patch = _patch_for(img_size, photos=photos)
    pad = {"dynamic_img_pad": True} if img_size[0] % patch or img_size[1] % patch else {}
    drop = token_drop if token_drop is not None else budget_token_drop(img_size, patch)
    for name, least, fields in reversed(MODELS):
        arch = {"patch_size": patch, **fields, **pad}
        step_macs = train_step_macs(forward_macs(arch, img_size, in_chans, token_drop=drop), batch)
        params = ViTConfig(img_size=img_size, in_chans=in_chans, **arch).num_params()
        save_s = save_seconds(params=params, trainable=params)
        end_s = pace.evaluation_s(forward_macs(arch, img_size, in_chans)) + save_s
        level, steps, per_step = paced_level(pace, left=left, step_macs=step_macs, batch=batch, end_s=end_s,
                                             n_train=n_train, photos=photo_data)  # fmt: skip
        if steps * batch >= least or name == MODELS[0][0]:
            return name, {**arch, **PLAIN}, drop, level, steps, per_step
    raise AssertionError("unreachable: the smallest model is always chosen")


def paced_level(
    pace: Pace, *, left: float, step_macs: float, batch: int, end_s: float, n_train: int, photos: bool = False,
    finetune: bool = False,
) -> tuple[str, int, float]:  # fmt: skip
    """``(level, steps, seconds a step)``: the augmentation level of a run that has ``left`` seconds for steps of
    ``step_macs`` on ``batch`` images and epoch ends of ``end_s`` (its evaluation and saving), at the measured
    ``pace``, and the steps it then makes (:func:`~.pace.steps_in_budget`, as the run's plan counts them). The level
    is the heaviest whose own cost still leaves the passes it asks for (:func:`~.levels.aug_level`: a level's
    augmentation slows the steps, so fewer passes might ask for a lighter one). A fresh run's candidates
    (:func:`_by_pace`) and a fine-tune (:func:`~.finetune.finetune_recipe`, ``finetune``) choose by it alike."""
    spe, order = max(1, n_train // batch), list(LEVELS)
    for level in reversed(order):
        per_step = pace.per_step(level=level, step_macs=step_macs, batch=batch)
        steps = steps_in_budget(left, per_step, end_s, spe)
        wanted = aug_level(epochs=steps * batch / n_train, n_train=n_train, photos=photos, finetune=finetune)
        if order.index(wanted) >= order.index(level):
            break
    return level, steps, per_step


_OPTIMIZERS = {
    "adamw": "AdamW",
    "adam": "Adam",
    "sgd": "SGD",
    "muon": "Muon (encoder matrices) + AdamW",
}


def auto_reason(
    r: Recipe, *, level: str, plain: str, passes: float, n_train: int, model: str, photos: bool = False,
    finetune: bool = False,
) -> str:  # fmt: skip
    """What :func:`auto_recipe` chose, after the data it was chosen for: the augmentation level and why (``plain``:
    the level for as many passes before the data's size shifted it, :func:`~.levels.aug_level` with ``n_train``
    0; ``finetune``: a fine-tune's, at most :data:`~.levels.FINETUNE_MOST`; ``photos``: kept to its crop and flip),
    the batch, LR and warmup, token dropping and the model."""
    ra = f"RandAugment{r.randaugment}" if r.randaugment else "no RandAugment"
    mix = f"MixUp {r.mixup:g} / CutMix {r.cutmix:g}" if r.mixup or r.cutmix else "no MixUp/CutMix"
    crop = "no crop" if r.crop_scale[0] == 1 else f"crop {r.crop_scale[0]:g}-1"
    crop += " square" if r.crop_ratio == (1.0, 1.0) and r.crop_scale[0] < 1 else ""
    passes_text = f"{passes:.0f}" if passes >= 10 or passes == int(passes) else f"{passes:.1f}"
    why = {"minimal": "short", "mild": "medium", "light": "medium", "medium": "long", "strong": "long"}[plain]
    order, most = list(LEVELS), FINETUNE_MOST
    capped = finetune and order.index(plain) > order.index(most)
    why += " schedule" + (f"; a fine-tune: at most {most}" if capped else "")
    why += f", lighter for {n_train:,} images" if level != (most if capped else plain) else ""
    if photos and finetune:  # (a fine-tune's photos: its crop and flip under FINETUNE_WHOLE_FROM passes)
        why += f"; photos: its crop and flip only under {FINETUNE_WHOLE_FROM} passes"
    elif photos:  # (a photo's level under PHOTO_CROP_FROM passes is the minimal one: no crop at all)
        short = plain == "minimal" and passes >= 10
        why += f"; photos: no crop under {PHOTO_CROP_FROM} passes" if short else "; photos: its crop and flip only"
    arch = r.arch
    return (
        f", {passes_text} {'pass' if passes_text == '1' else 'passes'} -> {level} aug ({why}): {crop}, flip, LS 0.1, "
        f"{ra}, {mix}, "
        f"random erasing {r.random_erasing:g}, stochastic depth {r.drop_path:g}, wd 0.05; "
        f"batch {r.batch_size} (<= 1/16 of the data), {_OPTIMIZERS[r.optimizer]} lr {r.lr:.2g}, "
        f"warmup {r.warmup_fraction:.0%} of the steps; "
        + (f"token drop {r.token_drop:g} in training; " if r.token_drop else "")
        + f"model {model} (patch {arch['patch_size']}{', padded' if arch.get('dynamic_img_pad') else ''}, "
        + f"width {arch['embed_dim']}, depth {arch['depth']}, "
        "sin-cos 2-D position embeddings)"
    )


def classify_recipe(
    cfg: Any,
    *,
    n_train: int,
    image_size: tuple[int, int],
    num_classes: int,
    in_chans: int,
    device_type: str,
    pace: Pace | None = None,
    photo_data: bool = False,
) -> tuple[Recipe, str | None]:
    """``(recipe, line)``: what a classifier run of ``cfg`` (a :class:`~vitlab.train.TrainConfig`) trains with on this
    data, and the line that says what was chosen (None: the recipe as asked). The ``auto`` recipe is resolved
    (:func:`auto_recipe`, :func:`~vitlab.train.conf.train_config.run_recipe`; ``pace``: measured on the data for a time
    budget; ``photo_data``: a folder of photos, :func:`~.side.holds_photos`); the ``finetune`` recipe's batch is
    scaled down to the data (the paper's passes over the data with a batch that fits: at most 1/16 of it, up to 512),
    its LR with the square root of the batch, as the auto recipe's (a small target's run sees few examples; see
    docs/transfer.md), and its warmup made 5% of the run (the paper's 500 of 10k steps). Fields the user set
    (``cfg.recipe_given``) are kept."""
    r = cfg.recipe
    given = {f: getattr(r, f) for f in cfg.recipe_given}
    if r.name == "auto":
        img = (cfg.img_size, cfg.img_size) if cfg.img_size else tuple(image_size)
        new, reason = auto_recipe(
            n_train=n_train,
            img_size=img,
            num_classes=num_classes,
            in_chans=in_chans,
            epochs=r.epochs if "epochs" in given else None,
            time_budget=cfg.time_budget,
            batch_size=given.get("batch_size"),
            token_drop=given.get("token_drop"),
            device_type=device_type,
            photos=min(img) >= PHOTO_SIDE,  # a photo-sized input (224 px): the paper's patch 16
            pace=pace if cfg.time_budget else None,
            photo_data=photo_data,
        )
        arch = dict(new.arch)
        user = {k: v for k, v in cfg.arch.items() if v is not None}
        if cfg.model or cfg.init:
            reason = reason.rsplit("; model", 1)[0] + f"; model {cfg.model or cfg.init} as given"
        elif "embed_dim" in user and "num_heads" not in user:  # keep 32-64 channels a head for the width given
            arch["num_heads"] = next(h for h in (12, 8, 6, 4, 3, 2, 1) if user["embed_dim"] % h == 0)
            arch["mlp_dim"] = 2 * user["embed_dim"]
        if user and not cfg.model:
            reason += f" (flags: {', '.join(f'{k}={v}' for k, v in user.items())})"
        chosen = new.optimizer
        new = run_recipe(cfg, dataclasses.replace(new, arch=arch))
        reason = reason.replace(f"{_OPTIMIZERS[chosen]} lr", f"{_OPTIMIZERS[new.optimizer]} lr")
        kept = sorted(set(given) - {"epochs", "batch_size"})  # the budget and batch are in the line already
        if kept:
            reason += f"; kept as given: {', '.join(kept)}"
        return new, reason
    if r.name == "finetune" and cfg.init:
        changes: dict[str, Any] = {}
        if "batch_size" not in given:
            changes["batch_size"] = b = auto_batch(n_train, cap=r.batch_size)
            if "lr" not in given and r.base_batch:  # a smaller batch, fewer examples: the LR by the square root
                changes.update(lr=r.lr * math.sqrt(b / r.base_batch), base_batch=b)
        if not {"warmup_steps", "warmup_epochs"} & set(given):
            changes.update(warmup_steps=0, warmup_epochs=0.0, warmup_fraction=0.05)
        new = r.replace(**changes)
        reason = (
            f"finetune on {n_train:,} images: batch {new.batch_size} (at most 1/16 of the data, up to 512), "
            f"lr {new.scaled_lr(new.batch_size):.2g} (0.03 at batch 512, scaled by the square root of the batch), "
            f"{new.epochs} epochs, "
            f"warmup {'as given' if 'warmup_fraction' not in changes else '5% of the steps'}"
        )
        return new, reason
    return r, None


def mpp_recipe(
    cfg: Any, *, n_train: int, image_size: tuple[int, int], recipe: Recipe | None = None
) -> tuple[Recipe, str | None]:
    """``(recipe, line)`` of a run of ``cfg`` (a :class:`~vitlab.train.TrainConfig` with ``--objective mpp``): its
    recipe fitted to the data, as the ``auto`` recipe fits classification (:func:`classify_recipe`): the patch size from
    the image size by the rule classification uses (16 for photos, as the paper's B/16; else about 8 x 8 tokens: the
    recipe's patch 4 is for 32 px images, and at 224 px it would give 3,136 tokens an image), unless a patch, a
    ``--model`` or an ``--init`` model is given; the batch at most 1/16 of the training set (the recipe's batch at most;
    the LR scales with it linearly). Fields the user set are kept; the line is None when nothing changed. ``recipe``:
    the recipe to fit (default: ``cfg``'s)."""
    r = recipe or cfg.recipe
    img = (cfg.img_size, cfg.img_size) if cfg.img_size else (r.img_size, r.img_size) if r.img_size else image_size
    h, w = int(img[0]), int(img[1])
    changes: dict[str, Any] = {}
    notes = []
    patch = cfg.arch.get("patch_size") or r.arch.get("patch_size")
    if patch and not cfg.arch.get("patch_size") and not (cfg.model or r.model or cfg.init):
        fitted = _patch_for((h, w), photos=True)  # the paper pre-trained B/16 this way at 224 px
        if fitted != patch:
            changes["arch"] = {**r.arch, "patch_size": fitted}
            notes.append(f"patch {fitted} for {h}x{w} px ({(h // fitted) * (w // fitted):,} tokens an image)")
            patch = fitted
    if "batch_size" not in cfg.recipe_given and (b := auto_batch(n_train, cap=r.batch_size)) != r.batch_size:
        changes["batch_size"] = b
        notes.append(f"batch {b} (at most 1/16 of the {n_train:,} images)")
    if not changes:
        return r, None
    new = dataclasses.replace(r, **changes)
    return new, f"mpp: {', '.join(notes)}, lr {new.scaled_lr(new.batch_size):.2g}"
