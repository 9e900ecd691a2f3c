"""Measure, then choose: the probes that time a run's candidates on this machine before anything is chosen.

- :func:`budget_passes`: before a folder is decoded (or shards read), the passes a time budget buys at each photo
  side (:func:`~vitlab.train.sizing.side.budget_photo_side`; a fine-tune's,
  :func:`~vitlab.train.sizing.side.budget_init_side`), from timed steps on random images;
- :func:`measure_pace`: before a time-budgeted ``auto`` recipe picks its augmentation level, batch and model, a
  few training steps of the smallest model the recipe would pick (with the token dropping it would train with; a
  fine-tune's own architecture, training what it trains: :func:`_init_step`),
  each augmentation level's transform on real training items (a folder's decoded images; tar shards' first
  samples, their decoding timed too: paid at every step, or once where the run keeps what it decodes), and an
  evaluation pass. :func:`vitlab.train.sizing.recipe.auto_recipe` then
  counts the steps of each candidate from that (:class:`~vitlab.train.sizing.pace.Pace`), as the run's plan will,
  so that the passes its line states are the passes the run plans;
- :func:`epoch_seconds`: the seconds of a run for a number of epochs at a side, for the line that proposes a
  faster side (:func:`~vitlab.train.sizing.side.faster_side_line`);
- :func:`teacher_seconds`: a distillation teacher's forward, which every one of them adds to each step.

One concern, the measuring half of the sizing room: every probe times with :func:`time_steps` and
:func:`time_update` in :class:`Here`, and keeps what it timed there for the next (:attr:`Here.timed`).

The probes build their own throw-away models (with the CPU speed paths, as the run's) and the run's optimizer
(:class:`Here` passes the engine's builder in: sizing does not import the engine); their random draws are made in a
fork of the generators (:func:`~vitlab.data.pipeline.seeding.seeded`), so the run does not depend on them."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...accel import accelerate
from ...adapters import DEFAULT_TARGETS, apply_tuning
from ...data import ArrayDataset, eval_transform, train_transform
from ...data.images.decode import decode_encoded
from ...data.pipeline.seeding import seeded
from ...data.shards.stream import KEEP_BYTES, StreamData, first_encoded
from ...data.sources import DataSource, ImageArray
from ...devices import autocast
from ...distributed import Dist
from ...errors import ConfigError
from ...models import VisionTransformer
from ...models.config import ViTConfig
from ..conf.arch import fresh_config
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig, objective_name, run_recipe
from .finetune import AUTO_LORA_RANK, METHOD_FLAGS, rule_settings, tune_method
from .levels import LEVELS, level_fields
from .machine import set_threads, workers_for
from .pace import Pace, budget_reserve, train_step_macs
from .recipe import auto_batch, auto_recipe, budget_token_drop, forward_macs, mpp_recipe
from .side import (
    PACKED_STEP_COST,
    PHOTO_CROP_PCT,
    PHOTO_SIDE,
    holds_photos,
    init_side,
    init_sides,
    store_side,
    token_px,
)

__all__ = [
    "Here",
    "budget_passes",
    "epoch_seconds",
    "measure_pace",
    "teacher_seconds",
    "time_steps",
    "time_update",
    "wants_budget_size",
    "wants_pace",
]

AUG_ITEMS = 16
"""Training items each level's transform is timed on."""
WARM_ITEMS = 8
"""Items each level's transform runs on untimed before it is timed (its operations' first calls)."""
PROBE_STEPS = 8
"""Training steps the run's probe times (after two untimed), fewer when they would take over
:data:`PROBE_SHARE` of the time budget."""
PROBE_SHARE = 0.01
"""The share of a time budget the probe's timed steps may take."""
EVAL_ITEMS = 128
"""Evaluation items timed (the whole split's time is scaled from them)."""
SIDE_BATCH = 32
"""Images a step of :func:`budget_passes` times at each side (the per-image cost is scaled to the run's batch)."""
PROBE_STEP_S = 0.5
"""A timed step of an ``--init`` architecture (:func:`_init_step`) doubles its images from 2 until it takes this long
or holds the run's batch: a few images a step cost more each than the run's batch does (the matrices are thinner),
while a large model's whole batch is too slow to time in a short budget (ViT-B/16 at 128 px on 2 CPU cores: about 6 s
a step of 128)."""
PASSES_LEVEL = "light"
"""The augmentation level whose cost :func:`budget_passes` counts: the level a run gets from
:data:`~vitlab.train.sizing.side.BUDGET_PASSES` passes, the threshold the passes are compared with."""


@dataclass(frozen=True, kw_only=True)
class Here:
    """Where a run is sized: this process (``dist``) and ``device``, its autocast dtype, ``t_start``
    (``time.perf_counter()`` when the run started: what a time budget has spent) and how the run builds its optimizer
    (``optimizer(model, recipe, lr)``: the engine's, so that a probe times the optimizer the run will train with).
    ``timed``: what the probes of this run measured, by what they timed, so that a later probe reuses it (the side
    rule's step of an ``--init`` architecture is the recipe's when the run trains at that side; a teacher's forward
    is timed once)."""

    dist: Dist
    device: torch.device
    amp_dtype: torch.dtype | None
    t_start: float
    optimizer: Callable[[nn.Module, Recipe, float], torch.optim.Optimizer]
    timed: dict[tuple, Any] = field(default_factory=dict)


class _ProbeLoss:
    """What a probe's steps minimise: the classification loss of the run (cross-entropy, label smoothing 0.1)."""

    @staticmethod
    def loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(net(x).float(), y, label_smoothing=0.1)


def _probe_model(
    cfg: TrainConfig, recipe: Recipe, *, num_classes: int, in_chans: int, img: tuple[int, int], names: list[str]
) -> nn.Module:
    """The throw-away model a probe times: the architecture rule's fresh model of ``recipe`` (the user's
    ``--model`` and architecture flags left out: the probe times the auto recipe's candidates), with the speed
    paths the run's model gets. It drops the tokens the recipe drops, ``--pack`` too: a packed run drops them in
    its loader (its model drops none), so a square step of as many tokens, times
    :data:`~.side.PACKED_STEP_COST`, is what its packed step costs."""
    probe_cfg = dataclasses.replace(cfg, arch={}, model=None, init=None, pack=False)
    c = fresh_config(probe_cfg, recipe=recipe, image_size=img, in_chans=in_chans, num_classes=num_classes,
                     class_names=names)  # fmt: skip
    return accelerate(VisionTransformer(c))


def time_steps(
    probe: nn.Module, opt: torch.optim.Optimizer, xs: torch.Tensor, ys: torch.Tensor, *, objective: Any,
    device: torch.device, amp_dtype: torch.dtype | None, n_warm: int = 2, n_time: int = 5, max_s: float = math.inf,
) -> float:  # fmt: skip
    """Seconds per training step of ``probe`` on the batch ``(xs, ys)``, the objective's loss: the median of
    ``n_time`` steps timed one by one after ``n_warm``, fewer once the timed steps have taken ``max_s`` seconds (at
    least two). The median, not the mean: a shared machine's pace drifts from one step to the next, and one slow
    step of a few would set the whole plan."""
    times: list[float] = []
    for i in range(n_warm + n_time):
        t0 = time.perf_counter()
        with autocast(device, amp_dtype):
            loss = objective.loss(probe, xs, ys)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= n_warm:
            times.append(time.perf_counter() - t0)
            if len(times) >= 2 and sum(times) >= max_s:
                break
    return statistics.median(times)


def time_update(
    probe: nn.Module, opt: torch.optim.Optimizer, xs: torch.Tensor, ys: torch.Tensor, *, objective: Any,
    device: torch.device, amp_dtype: torch.dtype | None, n_time: int = 5,
) -> float:  # fmt: skip
    """Seconds of the optimizer's update alone (``opt.step()`` on one batch's gradients, the median of ``n_time``):
    the part of a step whose cost does not shrink with the image or the tokens kept, large for Muon's
    orthogonalisation of every block matrix. ``opt`` is expected at LR 0, so the repeated updates move nothing."""
    with autocast(device, amp_dtype):
        loss = objective.loss(probe, xs, ys)
    loss.backward()
    times: list[float] = []
    for _ in range(n_time):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    opt.zero_grad(set_to_none=True)
    return statistics.median(times)


def _measured(cfg: TrainConfig, *, uses_labels: bool, dist: Dist) -> bool:
    """The ``auto`` recipe, a labelled objective and one process: a run whose recipe is chosen from what this machine
    measures (several processes would each measure their own and must choose one)."""
    return cfg.recipe.name == "auto" and uses_labels and not dist.enabled


def _measured_run(cfg: TrainConfig, *, uses_labels: bool, dist: Dist) -> bool:
    """A measured run (:func:`_measured`) of a fresh model: its model and side are chosen too (a fine-tune's are its
    ``--init`` model's)."""
    return _measured(cfg, uses_labels=uses_labels, dist=dist) and not cfg.init


def wants_pace(cfg: TrainConfig, data: Any, *, uses_labels: bool, dist: Dist) -> bool:
    """Whether a new run's recipe is chosen from a measured pace: a time-budgeted measured run (:func:`_measured`: a
    fresh model's or a fine-tune's, :mod:`~vitlab.train.sizing.finetune`) on training images in memory (a folder or a
    built-in set) or in tar shards (their first samples)."""
    train = getattr(data, "train", None)
    held = isinstance(train, ImageArray) or isinstance(data, StreamData)
    return bool(cfg.time_budget) and _measured(cfg, uses_labels=uses_labels, dist=dist) and held and len(train) > 0


def _mpp_fitted(cfg: TrainConfig, *, dist: Dist) -> bool:
    """Masked patch prediction with its own ``mpp`` recipe, from scratch, on one process: a recipe fitted to the
    data as ``auto`` fits a classifier's (:func:`~.recipe.mpp_recipe`), whose side the budget chooses as a measured
    run's (:func:`_measured`)."""
    return objective_name(cfg) == "mpp" and cfg.recipe.name == "mpp" and not cfg.init and not dist.enabled


def wants_budget_size(
    cfg: TrainConfig, source: DataSource, *, uses_labels: bool, dist: Dist, init: ViTConfig | None = None
) -> bool:
    """Whether a new run's photos are trained at a size chosen from its time budget (:func:`budget_passes`): a
    time-budgeted measured run (:func:`_measured`: a fresh model's, or a fine-tune's of a square ``--init`` model,
    ``init``: its configuration; masked patch prediction's, :func:`_mpp_fitted`) on the user's images (``source``:
    a folder or its shards, ``--pack`` too) with no size given (``--img-size``, a recipe's)."""
    return (
        bool(cfg.time_budget)
        and (_measured(cfg, uses_labels=uses_labels, dist=dist) or _mpp_fitted(cfg, dist=dist))
        and (not cfg.init or init_side(init) is not None)
        and not cfg.img_size
        and not cfg.recipe.img_size
        and source.users
    )


def wants_epoch_sides(cfg: TrainConfig, *, uses_labels: bool, dist: Dist) -> bool:
    """Whether a new photo run for a number of epochs times its side against a faster one
    (:func:`epoch_seconds`, :func:`~vitlab.train.sizing.side.faster_side_line`): a measured run without a time budget
    with no size given. (On the user's images: the caller asks it of data that holds photos,
    :func:`~vitlab.train.sizing.side.holds_photos`, which only a folder's or shards' storage can.)"""
    return (
        not cfg.time_budget
        and _measured_run(cfg, uses_labels=uses_labels, dist=dist)
        and not cfg.img_size
        and not cfg.recipe.img_size
    )


def teacher_seconds(cfg: TrainConfig, here: Here, teacher: ViTConfig | None) -> float:
    """Seconds a training image costs a distillation ``teacher`` (its configuration: random weights of that
    architecture, at its own input size, frozen, without gradients, as :class:`~vitlab.train.objectives.distill.Distill`
    runs it) beside each step; 0 without one. Timed on images doubled from 2 until a forward takes
    :data:`PROBE_STEP_S` or holds :data:`SIDE_BATCH` (the median of two after one untimed). A step of the auto
    recipe's student at 64 px costs a fraction of a teacher's forward: a 1-minute photo run distilled from a 64-px
    patch-4 model said ~380 steps of 122 ms, then planned 116 of 398 ms."""
    if teacher is None:
        return 0.0
    key = ("teacher", id(teacher))  # (the run's one teacher configuration)
    if key not in here.timed:
        here.timed[key] = _time_teacher(cfg, here, teacher)
    return here.timed[key]


def _time_teacher(cfg: TrainConfig, here: Here, teacher: ViTConfig) -> float:
    """:func:`teacher_seconds`, timed."""
    h, w = teacher.img_size
    with seeded(cfg.seed), torch.no_grad():
        c = teacher.replace(class_names=None, drop_path_rate=0.0, drop_rate=0.0, patch_drop_rate=0.0)
        model = accelerate(VisionTransformer(c)).to(here.device).eval()
        k = 2
        while True:
            xs = torch.randn(k, teacher.in_chans, h, w, device=here.device)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                with autocast(here.device, here.amp_dtype):
                    model(xs)
                times.append(time.perf_counter() - t0)
            each = statistics.median(times[1:])
            if each >= PROBE_STEP_S or k >= SIDE_BATCH:
                return each / k
            k = min(SIDE_BATCH, 2 * k)


def _image_seconds(
    cfg: TrainConfig, here: Here, *, side: int, n_train: int, epochs: int | None = None,
    teacher_s: float = 0.0, clock: Callable[[], float] = time.perf_counter,
) -> float:  # fmt: skip
    """Seconds a training image costs a photo run at ``side`` px (a step's share, its :data:`PASSES_LEVEL`
    augmentation beside or before it; a packed step :data:`~.side.PACKED_STEP_COST` times a square one), from
    timed training steps (:data:`SIDE_BATCH` random images) of the model the auto recipe would train there (for a
    time budget its smallest, with its token dropping; for ``epochs``, its model for them; masked patch
    prediction's, its recipe's model and batch there, :func:`~.recipe.mpp_recipe`: a step of its backbone, whose
    prediction of the masked patches' colours costs under 3% of it), on the threads the run will use;
    ``teacher_s``: a distillation teacher's forward an image (:func:`teacher_seconds`). Random draws are made in a
    fork of the generators: the run does not depend on them."""
    given = set(cfg.recipe_given)
    drop = cfg.recipe.token_drop if "token_drop" in given else None
    in_chans, classes = 3, 2  # photos decode as RGB; the head costs nothing measurable (classes are not read yet)
    img, batch = (side, side), cfg.recipe.batch_size if "batch_size" in given else auto_batch(n_train)
    budget = 1e-9 if epochs is None else None
    if objective_name(cfg) == "mpp":  # (its light crop and flip cost what the light level's photo crop does)
        recipe, _ = mpp_recipe(cfg, n_train=n_train, image_size=img)
        batch = recipe.batch_size
    else:
        recipe, _ = auto_recipe(n_train=n_train, img_size=img, num_classes=classes, in_chans=in_chans, epochs=epochs,
                                time_budget=budget, batch_size=batch, token_drop=drop, photos=True)  # fmt: skip
    k = min(batch, SIDE_BATCH)
    with seeded(cfg.seed):
        model = _probe_model(cfg, recipe, num_classes=classes, in_chans=in_chans, img=img,
                             names=[str(i) for i in range(classes)]).to(here.device)  # fmt: skip
        set_threads(cfg, device=here.device, step_macs=train_step_macs(model.macs(), batch))
        xs = torch.randn(k, in_chans, side, side, device=here.device)
        ys = torch.randint(0, classes, (k,), device=here.device)
        opt = here.optimizer(model, run_recipe(cfg, recipe), 0.0)  # the run's: Muon's step costs more
        model.train()
        step_s = time_steps(model, opt, xs, ys, objective=_ProbeLoss, device=here.device,
        amp_dtype=here.amp_dtype,
                            n_warm=2, n_time=2)  # fmt: skip
        aug_s = _time_augmentation(side, level=PASSES_LEVEL, in_chans=in_chans, clock=clock)
    step_s *= PACKED_STEP_COST if cfg.pack else 1.0
    pace = Pace(step_s=step_s * batch / k, step_macs=1.0, batch=batch, aug_s={PASSES_LEVEL: aug_s}, teacher_s=teacher_s,
                workers=workers_for(cfg, device=here.device, steps_per_epoch=n_train // batch))  # fmt: skip
    return pace.per_step(level=PASSES_LEVEL, step_macs=1.0, batch=batch) / batch


def _init_step(
    cfg: TrainConfig, here: Here, init: ViTConfig, *, side: int, batch: int, drop: float, n_train: int
) -> tuple[float, float, int, int]:
    """:func:`_time_init_step`, timed once a run for each side, batch, token dropping and training set (``here.timed``:
    the side rule's probe and the recipe's time the same step when the run trains at the side the rule timed)."""
    key = ("init", id(init), side, batch, drop, n_train)  # (the run's one --init configuration)
    if key not in here.timed:
        here.timed[key] = _time_init_step(cfg, here, init, side=side, batch=batch, drop=drop, n_train=n_train)
    return here.timed[key]


def _time_init_step(
    cfg: TrainConfig, here: Here, init: ViTConfig, *, side: int, batch: int, drop: float, n_train: int
) -> tuple[float, float, int, int]:
    """``(seconds of a step's compute, seconds of its update, images timed, threads)``: one training step of ``batch``
    images of ``init``'s architecture (the ``--init`` model's configuration: random weights, a 2-class head, dropping
    the share ``drop`` of its tokens) at ``side`` px on random images, training what the fine-tune trains
    (:func:`_fine_tune_method`, :func:`_train_only`: LoRA's adapters, the head alone ...; before, a full step times
    2.8/3 stood for a LoRA one), with the run's optimizer and threads. Timed on images doubled from 2 until a step
    takes :data:`PROBE_STEP_S` or holds ``batch``, and scaled to ``batch``; the optimizer's update is timed alone and
    not scaled (it costs the same for any batch and side). Random draws are made in a fork of the generators."""
    with seeded(cfg.seed):
        c = init.replace(img_size=(side, side), num_classes=2, head="linear", representation_size=None,
                         class_names=None, patch_drop_rate=drop, drop_path_rate=0.0, drop_rate=0.0)  # fmt: skip
        model = accelerate(VisionTransformer(c)).to(here.device)
        method, rank = _fine_tune_method(cfg, init, n_train=n_train)
        _train_only(model, cfg, method=method, rank=rank)
        threads = set_threads(cfg, device=here.device, step_macs=train_step_macs(model.macs(), batch)).threads
        recipe, _ = auto_recipe(n_train=n_train, img_size=(side, side), num_classes=2, in_chans=init.in_chans,
                                time_budget=1e-9, batch_size=batch, photos=True)  # fmt: skip
        opt = here.optimizer(model, run_recipe(cfg, recipe), 0.0)  # LR 0: the repeated steps move nothing
        model.train()
        kw = {"objective": _ProbeLoss, "device": here.device, "amp_dtype": here.amp_dtype}
        k = min(2, batch)
        while True:
            xs = torch.randn(k, init.in_chans, side, side, device=here.device)
            ys = torch.randint(0, 2, (k,), device=here.device)
            step = time_steps(model, opt, xs, ys, n_warm=1, n_time=2, **kw)
            if step >= PROBE_STEP_S or k >= batch:
                break
            k = min(batch, 2 * k)
        update = time_update(model, opt, xs, ys, n_time=2, **kw)
    return max(0.0, step - update) * batch / k, update, k, threads


def _fine_tune_method(cfg: TrainConfig, init: ViTConfig, *, n_train: int) -> tuple[str, int]:
    """``(method, LoRA rank)``: what a fine-tune of ``init`` on ``n_train`` images trains (a recipe's ``tuning``): the
    user's ``--tune``, ``--lora`` or ``--freeze``, else the rule's pick (:func:`~.finetune.tune_method`, LoRA at
    :data:`~.finetune.AUTO_LORA_RANK`), as the fine-tune's recipe will choose it after the probes."""
    r = cfg.recipe
    if METHOD_FLAGS & set(cfg.recipe_given):
        return r.tuning, r.lora_rank
    return tune_method(n_train=n_train, params=init.num_params(), **rule_settings(cfg))[0], AUTO_LORA_RANK


def _train_only(model: nn.Module, cfg: TrainConfig, *, method: str, rank: int) -> None:
    """Make a probe ``model`` train what the run's will (``method``, a recipe's ``tuning``), as the engine makes it:
    the head alone, or :func:`vitlab.adapters.apply_tuning`'s adapters with the run's rank, scale and targets. Targets
    that name nothing are the run's own error to tell (with its option): the probe then times every weight."""
    if method == "head":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("head."))
    elif method != "full":
        r = cfg.recipe
        try:
            apply_tuning(model, method, rank=rank, alpha=r.lora_alpha, targets=r.lora_targets or DEFAULT_TARGETS)
        except ConfigError:
            model.requires_grad_(True)


def _init_image_seconds(
    cfg: TrainConfig, here: Here, init: ViTConfig, *, n_train: int, clock: Callable[[], float], teacher_s: float = 0.0
) -> Callable[[int], float]:
    """``seconds(side)``: what a training image costs a fine-tune of ``init`` (the ``--init`` model's configuration)
    at ``side`` px, as :func:`_image_seconds` counts a fresh model's: a training step of that architecture (the
    tokens the fine-tune's budget drops) timed once (:func:`_init_step`) at the smallest side the rule may take
    (:func:`~.side.init_sides`: the cheapest), its compute scaled to each side by its multiply-accumulates (the
    update is not: it costs the same at every side); the augmentation timed at each side
    (``teacher_s``: a distillation teacher's forward an image, added)."""
    given, patch = set(cfg.recipe_given), token_px(init)  # (a hybrid's tokens: its stem's stride x the patch)
    batch = cfg.recipe.batch_size if "batch_size" in given else auto_batch(n_train)
    arch = {"patch_size": patch, "embed_dim": init.embed_dim, "depth": init.depth, "mlp_dim": init.mlp_dim}

    def drop(side: int) -> float:
        return cfg.recipe.token_drop if "token_drop" in given else budget_token_drop((side, side), patch)

    def macs(side: int) -> float:
        return forward_macs(arch, (side, side), init.in_chans, token_drop=drop(side))

    ref = init_sides(init_side(init) or init.img_size[0], patch)[-1]

    def seconds(side: int) -> float:
        compute, update, _, _ = _init_step(cfg, here, init, side=ref, batch=batch, drop=drop(ref), n_train=n_train)
        step_s = (compute * macs(side) / macs(ref) + update) * (PACKED_STEP_COST if cfg.pack else 1.0)
        with seeded(cfg.seed):  # (its random images drawn in a fork of the generators too)
            aug_s = _time_augmentation(side, level=PASSES_LEVEL, in_chans=init.in_chans, clock=clock)
        pace = Pace(step_s=step_s, step_macs=1.0, batch=batch, aug_s={PASSES_LEVEL: aug_s}, teacher_s=teacher_s,
                    workers=workers_for(cfg, device=here.device, steps_per_epoch=n_train // batch))  # fmt: skip
        return pace.per_step(level=PASSES_LEVEL, step_macs=1.0, batch=batch) / batch

    return seconds


def budget_passes(
    cfg: TrainConfig, here: Here, *, init: ViTConfig | None = None, teacher: ViTConfig | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[int, int], float]:  # fmt: skip
    """``passes(side, n_train)``: the passes over ``n_train`` images that the rest of the time budget buys at
    ``side`` px (:func:`_image_seconds`; a fine-tune of ``init``, the ``--init`` model's configuration:
    :func:`_init_image_seconds`; a distillation ``teacher``'s forward added, :func:`teacher_seconds`, timed once).
    Called before a folder is decoded (or shards read), so that it is stored
    for the side chosen (:func:`~vitlab.train.sizing.side.budget_photo_side`, :func:`~.side.budget_init_side`); the
    steps and the augmentation of random photos are counted, not the evaluations (the run's own probe,
    :func:`measure_pace`, then plans with them)."""

    def passes(side: int, n_train: int) -> float:
        beside = teacher_seconds(cfg, here, teacher)  # (timed at the first call)
        if init is not None:
            per_image = _init_image_seconds(cfg, here, init, n_train=n_train, clock=clock, teacher_s=beside)(side)
        else:
            per_image = _image_seconds(cfg, here, side=side, n_train=n_train, teacher_s=beside, clock=clock)
        left = cfg.time_budget - budget_reserve(cfg.time_budget) - (clock() - here.t_start)
        return max(0.0, left) / (per_image * max(1, n_train))

    return passes


def epoch_seconds(
    cfg: TrainConfig, here: Here, *, side: int, n_train: int, epochs: int, teacher_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> float:  # fmt: skip
    """Seconds of training ``epochs`` epochs over ``n_train`` photos at ``side`` px, the model and augmentation the
    auto recipe picks for them (:func:`_image_seconds`, ``teacher_s`` a distillation teacher's forward an image;
    evaluations not counted): what the line proposing a faster side compares
    (:func:`~vitlab.train.sizing.side.faster_side_line`)."""
    per_image = _image_seconds(cfg, here, side=side, n_train=n_train, epochs=epochs, teacher_s=teacher_s, clock=clock)
    return per_image * n_train * epochs


def _level_transform(
    level: str, *, img: tuple[int, int], mean: Any, std: Any, in_chans: int, crop_pct: float, photos: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The training transform of the auto recipe's augmentation ``level``
    (:func:`~vitlab.train.sizing.levels.level_fields`; ``photos``: the photo variant) at ``img``, flip 0.5, as a run
    of that level builds it: what the probes time."""
    f = level_fields(level, photos=photos)
    return train_transform(img_size=img, mean=mean, std=std, in_chans=in_chans, crop_scale=f["crop_scale"],
                           crop_ratio=f["crop_ratio"], hflip=0.5, randaugment=f["randaugment"],
                           random_erasing=f["random_erasing"], crop_pct=crop_pct)  # fmt: skip


def _time_augmentation(side: int, *, level: str, in_chans: int, clock: Callable[[], float]) -> float:
    """Seconds per image of ``level``'s training transform for a ``side`` px photo run, on random images stored as
    such a run stores them (:func:`~vitlab.train.sizing.side.store_side`, 3:4 portrait)."""
    short = store_side(side, PHOTO_CROP_PCT)
    tf = _level_transform(level, img=(side, side), mean=(0.5,) * in_chans, std=(0.5,) * in_chans, in_chans=in_chans,
                          crop_pct=PHOTO_CROP_PCT, photos=True)  # fmt: skip
    items = [torch.randint(0, 256, (in_chans, short * 4 // 3, short), dtype=torch.uint8) for _ in range(AUG_ITEMS)]
    tf(items[0])  # untimed: the transforms' first calls
    t0 = clock()
    for x in items:
        tf(x)
    return (clock() - t0) / len(items)


def _items(split: Any, k: int, *, at_least: tuple[int, int], clock: Callable[[], float]) -> tuple[list, float, float]:
    """``(images, seconds each to read, seconds each to decode)``: ``k`` images of ``split`` spread over it (a
    folder's decoded images, read from the cache's pages, paid once by the run: 0 s) or its first ``k`` samples (tar
    shards: read from the shards as every pass of the run reads each sample, then decoded as its first pass decodes
    it)."""
    if isinstance(split, ImageArray):
        n = len(split)
        idx = [i * n // max(1, min(k, n)) for i in range(min(k, n))]
        return [split.images[i] for i in idx], 0.0, 0.0
    t0 = clock()
    with contextlib.closing(first_encoded(split)) as samples:
        encoded = list(itertools.islice(samples, k))
    t1 = clock()
    images = []
    for data in encoded:
        try:
            images.append(np.asarray(decode_encoded(data, at_least=at_least)))
        except Exception:  # a sample that does not decode: the run reports it; its time is the others'
            continue
    n = max(1, len(encoded))
    return images, (t1 - t0) / n, (clock() - t1) / n


def measure_pace(
    cfg: TrainConfig, data: Any, here: Here, *, init: ViTConfig | None = None, teacher: ViTConfig | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Pace:  # fmt: skip
    """The :class:`~vitlab.train.sizing.pace.Pace` of this run on this machine (see the module's notes); a
    fine-tune's steps (``init``: the ``--init`` model's configuration) timed on that architecture at the run's side
    (:func:`_init_step`), not scaled from the tiny model's: ViT-B/16's step at 128 px was estimated at 13.4 s from the
    tiny model's multiply-accumulates where the run took 5.8 s; a distillation ``teacher``'s forward
    (:func:`teacher_seconds`) beside every step. The probe models are thrown away; the random draws are
    made in a fork of the generators (:func:`~vitlab.data.pipeline.seeding.seeded`), so the run's own weights and
    augmentation do not depend on it. Sets torch's threads as the run will
    (:func:`~vitlab.train.sizing.machine.set_threads`)."""
    n_train, in_chans = len(data.train), data.in_chans
    img = (cfg.img_size, cfg.img_size) if cfg.img_size else tuple(int(s) for s in data.image_size)
    given = set(cfg.recipe_given)
    batch = cfg.recipe.batch_size if "batch_size" in given else auto_batch(n_train)
    drop = cfg.recipe.token_drop if "token_drop" in given else None
    recipe, _ = auto_recipe(  # the smallest candidate: what a tiny budget picks
        n_train=n_train, img_size=img, num_classes=data.num_classes, in_chans=in_chans, time_budget=1e-9,
        batch_size=batch, token_drop=drop, photos=min(img) >= PHOTO_SIDE,
    )  # fmt: skip
    stored = getattr(data, "storage", None)
    crop_pct = stored.crop_pct if stored is not None else 1.0
    photos = holds_photos(data)  # (a fine-tune's passes too: counted at the crop's cost, .levels.FINETUNE_WHOLE_FROM)
    device = here.device
    with seeded(cfg.seed):
        model = _probe_model(cfg, recipe, num_classes=data.num_classes, in_chans=in_chans, img=img,
                             names=list(data.class_names)).to(device)  # fmt: skip
        image_macs = float(forward_macs(recipe.arch, img, in_chans))
        step_macs = train_step_macs(forward_macs(recipe.arch, img, in_chans, token_drop=recipe.token_drop), batch)
        threads = set_threads(cfg, device=device, step_macs=train_step_macs(model.macs(), batch)).threads  # the run's
        workers = workers_for(cfg, device=device, steps_per_epoch=n_train // batch)
        k = min(AUG_ITEMS, n_train)
        train, read_s, decode_s = _items(data.train, k, at_least=(img[1], img[0]), clock=clock)
        k = len(train)
        kept = _kept_share(train, n_train, store_side=stored.store_side if stored is not None else None)
        kept = kept if workers == 0 else 0.0  # a worker's kept decodes last one epoch
        aug_s, items = {}, []
        for level in LEVELS:
            tf = _level_transform(level, img=img, mean=model.config.mean, std=model.config.std, in_chans=in_chans,
                                  crop_pct=crop_pct, photos=photos)  # fmt: skip
            ds = ArrayDataset(train, [0] * k, transform=tf, in_chans=in_chans)
            # untimed: the first reads of the cache's pages (once) and each level's first calls of its operations,
            # which the run pays once, not at every step
            _ = [ds[i] for i in range(k if not aug_s else min(k, WARM_ITEMS))]
            t0 = clock()
            xs_level = [ds[i][0] for i in range(k)]
            aug_s[level] = (clock() - t0) / max(1, k) + read_s + decode_s * (1 - kept)
            items = items or xs_level
        if init is None or img[0] != img[1]:  # the tiny model's step, which the candidates' are scaled from
            xs = torch.stack([items[i % len(items)] for i in range(batch)]).to(device)
            ys = torch.randint(0, max(1, data.num_classes), (batch,), device=device)
            opt = here.optimizer(model, run_recipe(cfg, recipe), 0.0)  # the run's: Muon's step costs more
            model.train()
            step_s = time_steps(model, opt, xs, ys, objective=_ProbeLoss, device=device, amp_dtype=here.amp_dtype,
                                n_warm=2, n_time=PROBE_STEPS, max_s=PROBE_SHARE * cfg.time_budget)  # fmt: skip
            what = "the tiny model"
        eval_s, eval_first_s = _time_eval(model, data.val, n_val=len(data.val), img=img, in_chans=in_chans,
                                          crop_pct=crop_pct, device=device, clock=clock)  # fmt: skip
    if init is not None and img[0] == img[1]:  # a fine-tune: its own architecture's step
        t = token_px(init)
        arch = {"patch_size": t, "embed_dim": init.embed_dim, "depth": init.depth, "mlp_dim": init.mlp_dim}
        drop = cfg.recipe.token_drop if "token_drop" in given else budget_token_drop(img, t)
        compute, update, k, threads = _init_step(cfg, here, init, side=img[0], batch=batch, drop=drop,
                                                 n_train=n_train)  # fmt: skip
        tuning = _fine_tune_method(cfg, init, n_train=n_train)[0]  # (the step timed: that method's)
        step_s = compute + update
        step_macs = train_step_macs(forward_macs(arch, img, in_chans, token_drop=drop), batch, tuning=tuning)
        what = f"the --init architecture, timed on {k}"
    step_s *= PACKED_STEP_COST if cfg.pack else 1.0
    teacher_s = teacher_seconds(cfg, here, teacher)
    return Pace(
        step_s=step_s, step_macs=step_macs, batch=batch, aug_s=aug_s, workers=workers, eval_s=eval_s,
        eval_image_macs=image_macs, n_eval=len(data.val), elapsed_s=clock() - here.t_start, arch=dict(recipe.arch),
        read_s=read_s, first_pass_s=decode_s * kept * n_train + eval_first_s,
        probe=f"{step_s * 1000:.0f} ms a step of {batch} for {what} on {threads} thread(s)"
        + (f" (packed: {PACKED_STEP_COST:g}x a square step)" if cfg.pack else "")
        + f", the augmentation on {len(items)} of the training images"
        + (f", the teacher's forward {teacher_s * 1000:.1f} ms an image" if teacher is not None else ""),
        teacher_s=teacher_s,
    )  # fmt: skip


def _time_eval(
    model: nn.Module, val: Any, *, n_val: int, img: tuple[int, int], in_chans: int, crop_pct: float,
    device: torch.device, clock: Callable[[], float],
) -> tuple[float, float]:  # fmt: skip
    """``(seconds of one evaluation of val, seconds its first one costs beyond that)``: the reading, transform and
    forward, from up to :data:`EVAL_ITEMS` of it; tar shards' samples are decoded by the first evaluation only (its
    batches are kept, as much of them as :data:`~vitlab.data.shards.stream.KEEP_BYTES` holds)."""
    tf = eval_transform(img_size=img, mean=model.config.mean, std=model.config.std, in_chans=in_chans,
                        crop_pct=crop_pct)  # fmt: skip
    images, read_s, decode_s = _items(val, EVAL_ITEMS, at_least=(img[1], img[0]), clock=clock)
    read_s += decode_s
    n = len(images)
    if n == 0:  # no evaluation split: nothing to time
        return 0.0, 0.0
    ds = ArrayDataset(images, [0] * n, transform=tf, in_chans=in_chans)
    model.eval()
    _ = [ds[i] for i in range(n)]  # untimed: the first reads of the cache's pages, paid once by the run
    t0 = clock()
    with torch.no_grad():
        model(torch.stack([ds[i][0] for i in range(n)]).to(device))
    kept = min(1.0, KEEP_BYTES / max(1, n_val * 4 * in_chans * img[0] * img[1]))  # float batches
    return ((clock() - t0) / n + read_s * (1 - kept)) * n_val, read_s * kept * n_val


def _kept_share(images: list, n: int, *, store_side: int | None) -> float:
    """The share of ``n`` training images like ``images`` (decoded samples) that a shard run keeps decoded after
    its first pass: none unless they are stored at a side (:class:`~vitlab.data.shards.stream.KeptDecode`, the
    shorter side at most ``store_side``), else as many as :data:`~vitlab.data.shards.stream.KEEP_BYTES` holds."""
    if store_side is None or not images:
        return 0.0
    each = 0.0
    for a in images:
        h, w = a.shape[:2]
        scale = min(1.0, store_side / max(1, min(h, w)))
        each += round(h * scale) * round(w * scale) * (a.shape[2] if a.ndim == 3 else 1)
    return min(1.0, KEEP_BYTES / max(1.0, each / len(images) * n))
