"""``vitlab finetune``'s default recipe (no torch): ``--recipe auto`` with ``--init`` fits a fine-tuning of the
pre-trained model to the data, the budget and the model, as ``auto`` fits training from scratch (:mod:`.recipe`).

The rule (:func:`finetune_recipe`), every part of which a user may override with its flag:

- **optimiser**: AdamW, weight decay 0.05, clipping at 1, warmup 10% of the steps (5% from 5,000) then cosine.
  It was the best point of docs/transfer.md's grid (a pre-trained width-96 model fine-tuned on 1,000 images of new
  classes, AdamW against the paper's SGD); the paper's SGD recipe stays reachable as ``--recipe finetune``.
- **learning rate**: :data:`FT_LR` at batch :data:`FT_BATCH` for models up to :data:`FT_WIDTH` wide (what was
  measured); a wider model gets it times ``FT_WIDTH / width`` (Adam's LR for hidden weights falls as the width grows:
  muP, Yang et al. 2021; a pre-trained ViT-B/16 then fine-tunes at 2.5e-4 at batch 64), and every batch scales it by
  the square root of ``batch / FT_BATCH``, as ``auto`` does.
- **batch**: at most 1/16 of the training set, 8 to 128 (:func:`~.fitting.auto_batch`).
- **length**: ``--epochs`` (default: the ``auto`` recipe's 30), or ``--time-budget``: then, as for ``train``, half
  the patch tokens are dropped in training (:func:`~.recipe.budget_token_drop`: grids of at least 16 tokens), and
  the passes that choose the augmentation are counted from the pace a probe measured on the run's data, as a fresh
  run's are (:func:`~.recipe.paced_level`: the ``--init`` model's step scaled from the probe's by its
  multiply-accumulates and what trains, :func:`~.pace.train_step_macs`, with each epoch's evaluation and saving);
  the run then plans its steps from its own measured step (:mod:`vitlab.train.sizing.budget`). Without a probe
  (several processes) they are estimated from :data:`~.recipe.MACS_PER_S` and the same count of the step's work.
- **augmentation**: the level for the passes and the data (:func:`~.levels.aug_level`, after AugReg), as ``auto``,
  but at most :data:`~.levels.FINETUNE_MOST` (the light level: RandAugment(2, 7), stochastic depth 0.05, a crop of
  0.5-1); on photos its crop and flip only (:func:`~.levels.level_fields`) under
  :data:`~.levels.FINETUNE_WHOLE_FROM` passes, the level whole from there: on the clothing photos a heavier level
  lost 2 to 19 points, the crop alone 6 at 61-64 passes and 12 at 120-146, and led by about 2 at 24-31
  (docs/transfer.md). The end of run's advice never proposes undoing what this rule chose
  (:func:`~.levels.regularisers`).
- **method** (:func:`tune_method`, issue 60; ``--tune``, ``--lora`` or ``--freeze`` choose it instead): LoRA (rank
  :data:`AUTO_LORA_RANK`) below :data:`FULL_FROM` images per parameter, every weight from there: on docs/transfer.md's
  table (a model pre-trained on CIFAR-10's animals, fine-tuned on 100, 1,000 and 3,000 images of its vehicles and on
  3,068 phone photos of clothes, two seeds, each method for the same wall time) every weight was the best mean on
  every target, the head alone, SSF and LoRA trailing (LoRA tied on 1,000 images). The end of run's advice judges a
  method given by the same rule (:func:`method_advice`).
- **LP-FT** (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"): a new head on fewer than
  :data:`SMALL_DATA` images trains alone first (``--head-warmup``), for the first half of the LR warmup and at most
  one epoch, so that the pre-trained features are not updated through a random head's gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from ..._text import size_px
from ..._units import counted
from ...models.config import ViTConfig
from ..conf.arch import head_choice
from ..conf.recipes import RECIPES, Recipe
from .levels import FINETUNE_WHOLE_FROM, aug_level, level_fields
from .pace import Pace, save_seconds, train_step_macs
from .recipe import (
    COMMON_FIELDS,
    auto_batch,
    auto_reason,
    budget_token_drop,
    estimated_images,
    forward_macs,
    paced_level,
)

__all__ = [
    "AUTO_LORA_RANK",
    "FT_BATCH",
    "FT_LR",
    "FT_WIDTH",
    "FULL_FROM",
    "SMALL_DATA",
    "finetune_lr",
    "finetune_recipe",
    "method_advice",
    "tune_method",
]

FT_LR, FT_BATCH, FT_WIDTH = 2e-3, 64, 96
"""AdamW's fine-tuning LR at batch ``FT_BATCH`` for models up to ``FT_WIDTH`` wide (docs/transfer.md's grid)."""
SMALL_DATA = 10_000
"""Fewer training images than this: a new head trains alone first (LP-FT); the augmentation levels shift at the same
size (:func:`~.fitting.aug_level`)."""


AUTO_LORA_RANK = 4
"""LoRA's rank when the rule picks it (``--lora R`` sets another): the rank of docs/transfer.md's table."""
FULL_FROM = 50e-6
"""Images per parameter from which every weight trains; below, LoRA. On a 0.54M-parameter model every weight led on
100 images (0.00019 a parameter: 57.0% against 51.4 for the head alone, 50.4 SSF, 49.6 LoRA), 1,000 (67.7 against
LoRA's 65.9, a tie), 3,000 and 3,068 photos (docs/transfer.md, the budget's passes counted from the measured pace);
the V-PETL benchmark's ViT-B/16 (86M) on 1,000 images a task (0.000012 a parameter; VTAB-1k) found LoRA ahead (72.3
against 65.6). The boundary is the geometric middle of the two: LoRA on ViT-B/16 under 4,300 images. Per parameter
because a larger model overfits a small set sooner. (The head alone, a linear probe, led nowhere: ``--freeze``.)"""


def tune_method(*, n_train: int, params: int, fsdp: bool = False, muon: bool = False) -> tuple[str, str]:
    """``(method, why)``: what a fine-tune of a ``params``-parameter model on ``n_train`` images trains (see the
    module's notes: :data:`FULL_FROM`). Under ``--fsdp`` (no adapters there) LoRA gives way to full fine-tuning;
    ``muon``: the user asked for Muon, which updates whole matrices: every weight."""
    per = n_train / max(params, 1)
    if per < FULL_FROM:
        method, why = "lora", f"{per:.2g} images a parameter, under {FULL_FROM:g}: LoRA r={AUTO_LORA_RANK}"
    else:
        method, why = "full", f"{per:.2g} images a parameter, {FULL_FROM:g} or more: every weight"
    if fsdp and method == "lora":
        method, why = "full", why + " (--fsdp holds no adapters: every weight)"
    if muon and method != "full":
        method, why = "full", why + " (--optimizer muon updates whole matrices: every weight)"
    return method, why + " (docs/transfer.md)"


METHOD_FLAGS = frozenset({"tune", "lora", "freeze"})
"""The recipe fields by which a user chooses what a fine-tune trains (``--tune``, ``--lora``, ``--freeze``): given,
the rule does not pick; the end of the run judges the choice by it instead (:func:`given_method_advice`)."""


def rule_settings(cfg: Any) -> dict[str, bool]:
    """The run's options :func:`tune_method` weighs (``fsdp``, ``muon``), from what ``cfg`` (a
    :class:`~vitlab.train.conf.train_config.TrainConfig`) asked: the pick and the advice read them alike."""
    r, given = cfg.recipe, set(cfg.recipe_given)
    return {"fsdp": bool(cfg.fsdp), "muon": "optimizer" in given and r.optimizer == "muon"}


def given_method_advice(cfg: Any, tuning: str, *, n_train: int, params: int) -> tuple[str, str] | None:
    """The end of a fine-tune's judgement (:func:`method_advice`) of the method ``tuning`` it trained, when the user
    chose it (:data:`METHOD_FLAGS`); None for a run whose method the rule picked, or a run without ``--init``."""
    if not cfg.init or not METHOD_FLAGS & set(cfg.recipe_given):
        return None
    return method_advice(tuning, n_train=n_train, params=params, **rule_settings(cfg))


def method_advice(
    tuning: str, *, n_train: int, params: int, fsdp: bool = False, muon: bool = False
) -> tuple[str, str] | None:
    """``(finding, fix)`` the end of a fine-tune says when the method it trained (``tuning``, given by the user) is
    not the one :func:`tune_method` picks for its data, its model and the same settings (``fsdp``, ``muon``: so the
    fix is never one the run's other flags refuse); None when they agree, or for bias-only tuning (not on the table
    the rule was measured on)."""
    method, why = tune_method(n_train=n_train, params=params, fsdp=fsdp, muon=muon)
    if tuning in (method, "bias"):
        return None
    flag = {"lora": f"--lora {AUTO_LORA_RANK}", "full": "--tune full"}[method]
    return f"--tune {tuning} where the fine-tune rule picks {method} ({why})", flag


def finetune_lr(*, width: int, batch: int) -> float:
    """The AdamW peak LR for fine-tuning a pre-trained model of ``width`` at ``batch`` (see the module's notes)."""
    return FT_LR * min(1.0, FT_WIDTH / width) * math.sqrt(batch / FT_BATCH)


def finetune_recipe(
    cfg: Any,
    *,
    n_train: int,
    class_names: Sequence[str],
    in_chans: int,
    device_type: str,
    init: ViTConfig,
    processes: int = 1,
    photos: bool = False,
    pace: Pace | None = None,
    stored: int | None = None,
) -> tuple[Recipe, str]:
    """``(recipe, line)``: the recipe of a run of ``cfg`` (a :class:`~vitlab.train.conf.train_config.TrainConfig` with
    ``--init`` and the ``auto`` recipe) fine-tuning ``init`` (the checkpoint's configuration) on ``n_train`` images
    (``photos``: a folder of photos the run crops from), and the line that says what was chosen. Fields the user set
    (``cfg.recipe_given``) are kept; the head-only phase needs one process (``processes``). ``pace``: what a probe
    measured on the data (:func:`~.probe.measure_pace`), from which a time budget's passes are counted; ``stored``:
    the side the photos were stored for (:func:`~.side.sized_recipe`: the side rule's, which under a time budget may
    be smaller than the ``--init`` model's), None for the model's own."""
    r = cfg.recipe
    given = {f: getattr(r, f) for f in cfg.recipe_given}
    batch = given.get("batch_size") or auto_batch(n_train)
    spe = max(1, n_train // batch)
    side = cfg.img_size or r.img_size or stored
    img = (side, side) if side else tuple(init.img_size)
    patch = (cfg.arch.get("patch_size") or init.patch_size) * init.stem_stride  # (a hybrid's token: stride x patch)
    arch = {"patch_size": patch, "embed_dim": init.embed_dim, "depth": init.depth, "mlp_dim": init.mlp_dim}
    new_head, _ = head_choice(init, class_names, new_head=cfg.new_head)
    params = init.num_params()
    method, picked = None, {}
    if not METHOD_FLAGS & set(cfg.recipe_given):  # (the run's choice: the config keeps what was asked)
        method = tune_method(n_train=n_train, params=params, **rule_settings(cfg))
        picked = {"tune": method[0], **({"lora": AUTO_LORA_RANK} if method[0] == "lora" else {})}
    tuning = method[0] if method is not None else r.tuning
    token_drop = given.get("token_drop")
    level = None
    if cfg.time_budget is not None:
        if token_drop is None:
            token_drop = budget_token_drop(img, patch)
        macs = forward_macs(arch, img, in_chans, token_drop=token_drop)
        if pace is not None:
            saved = params if tuning == "full" else 0  # (adapters' and a head's moments: a few bytes)
            end_s = pace.evaluation_s(forward_macs(arch, img, in_chans)) + save_seconds(params=params, trainable=saved)
            level, steps, per_step = paced_level(
                pace, left=pace.budget_left(cfg.time_budget), step_macs=train_step_macs(macs, batch, tuning=tuning),
                batch=batch, end_s=end_s, n_train=n_train, finetune=True,
            )  # fmt: skip
            how = f"~{counted(steps, 'step')} of {per_step * 1000:.0f} ms in {cfg.time_budget:.0f} s (measured: "
            how += f"{pace.probe})"
        else:
            seen = estimated_images(cfg.time_budget, image_step_macs=train_step_macs(macs, 1, tuning=tuning),
                                    device_type=device_type)  # fmt: skip
            steps = max(1, int(seen / batch))
            how = f"~{counted(steps, 'step')} (estimated for {cfg.time_budget:.0f} s on {device_type})"
        epochs, passes = r.epochs, steps * batch / n_train  # (the plan measures its steps: the epochs are unused)
    else:
        token_drop = token_drop or 0.0
        epochs = r.epochs if "epochs" in given else RECIPES["auto"].epochs
        steps, passes = epochs * spe, float(epochs)
        how = f"{counted(steps, 'step')} ({counted(epochs, 'epoch')} of {spe})"
    level = level or aug_level(epochs=passes, n_train=n_train, finetune=True)
    lp = new_head and n_train < SMALL_DATA and tuning != "head" and processes == 1 and not cfg.fsdp
    warm = 0.1 if steps < 5000 else 0.05
    fitted = {
        **COMMON_FIELDS,
        **level_fields(level, photos=photos and passes < FINETUNE_WHOLE_FROM),
        "optimizer": "adamw",
        "batch_size": batch,
        "base_batch": batch,
        "lr": finetune_lr(width=init.embed_dim, batch=batch),
        "epochs": epochs,
        "warmup_steps": 0,
        "warmup_epochs": 0.0,
        "warmup_fraction": warm,
        "clip_grad": 1.0,
        "token_drop": token_drop,
        "head_warmup": max(1, min(spe, round(warm / 2 * steps))) if lp else 0,
    }
    new = dataclasses.replace(r, **{**fitted, **given, **picked})
    head = (
        f"auto (fine-tuning {cfg.init}: width {init.embed_dim}, depth {init.depth}, {params / 1e6:.2g}M params): "
        f"{how} on {n_train:,} images ({size_px(img)}, {len(class_names)} classes)"
    )
    line = (
        head
        + auto_reason(
            new,
            level=level,
            plain=aug_level(epochs=passes, n_train=0),
            passes=passes,
            n_train=n_train,
            model="",
            photos=photos and passes < FINETUNE_WHOLE_FROM,
            finetune=True,
        ).rsplit("; model", 1)[0]
    )
    line += (
        f"; AdamW: lr {FT_LR:g} at batch {FT_BATCH} for models up to width {FT_WIDTH} (docs/transfer.md), "
        f"x {FT_WIDTH}/width beyond, x the square root of the batch ratio"
    )
    if method is not None:
        line = head + f"; method {method[0]}: {method[1]}" + line[len(head) :]
    if new.head_warmup:
        alone = counted(new.head_warmup, "step")
        line += f"; the new head trains alone for {alone} first (LP-FT: under {SMALL_DATA:,} images)"
    kept = sorted(set(given) - {"epochs", "batch_size"})
    if kept:
        line += f"; kept as given: {', '.join(kept)}"
    return new, line
