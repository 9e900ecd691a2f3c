"""The room's two steps (see :mod:`vitlab.train.sizing`): :func:`choose`, before the model is built, makes the run's
:class:`~.choice.Sizing` from what the rules decide on what the probes measure; :func:`plan`, after the loaders,
completes it with the plan of steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ...models.config import ViTConfig
from ...models.flops import count_macs
from ..conf.navit import pack_recipe
from ..conf.recipes import Recipe
from ..conf.train_config import TrainConfig, objective_name
from .budget import Replanner, plan_run
from .choice import Sizing
from .finetune import finetune_recipe
from .machine import fix_threads, set_threads, threads_line, workers_for
from .memory import memory_split
from .pace import Pace, train_step_macs
from .probe import Here, epoch_seconds, measure_pace, teacher_seconds, wants_epoch_sides, wants_pace
from .recipe import classify_recipe, mpp_recipe
from .side import FAST_SIDE, faster_side_line, holds_photos, sized_recipe

__all__ = ["choose", "plan", "recipe_for"]


def choose(
    cfg: TrainConfig,
    *,
    data: Any,
    here: Here,
    architecture: Callable[[Recipe], ViTConfig],
    num_classes: int,
    init: ViTConfig | None = None,
    teacher: ViTConfig | None = None,
    saved: Sizing | None = None,
    resumed: bool = False,
    log: Callable[[str], None] = print,
) -> Sizing:
    """What the run ``cfg`` gets on ``data`` here (:class:`Sizing`, without its plan), before the model is built, in
    order: the recipe fitted to the data (the rule for what the run learns,
    :func:`~vitlab.train.conf.train_config.objective_name`; for a time-budgeted ``auto`` run from a pace a probe
    measures first), the side the data was stored for (:func:`~.side.sized_recipe`), what ``--pack`` turns off, the
    architecture (``architecture(recipe)``: the engine's, fresh or the ``--init`` model's), the batch split for the free
    memory, the threads and workers. ``num_classes``: the head's; ``init``: the ``--init`` model's configuration;
    ``teacher``: a distillation teacher's (its memory counts, and its forward's time). ``saved``: the choices of a
    resumed or replayed run, kept (the threads of a replay too; a resumed run's machine may differ: its threads and
    workers are chosen again). Every line is printed through ``log`` and kept in :attr:`Sizing.lines`."""
    lines: list[str] = []

    def say(line: str | None) -> None:
        if line:
            lines.append(line)
            log(line)

    learns = objective_name(cfg)
    pace: Pace | None = None
    if saved is not None:
        recipe, chosen, pace = saved.recipe, saved.chosen, saved.pace
        if saved.replayed and chosen:
            say(f"{chosen} (replayed from {saved.replayed}; --replan to measure afresh)")
    else:
        if wants_pace(cfg, data, uses_labels=learns != "mpp", dist=here.dist):
            pace = measure_pace(cfg, data, here, init=init, teacher=teacher)
        recipe, chosen, off = recipe_for(cfg, data, init=init, device_type=here.device.type, pace=pace,
                                         processes=here.dist.world_size)  # fmt: skip
        say(chosen)
        say(off)
    mc = architecture(recipe)
    if saved is None and wants_epoch_sides(cfg, uses_labels=learns != "mpp", dist=here.dist) and holds_photos(data):
        side = mc.img_size[0]
        if side > FAST_SIDE and mc.img_size[0] == mc.img_size[1]:
            n, t = len(data.train), teacher_seconds(cfg, here, teacher)
            at = {s: epoch_seconds(cfg, here, side=s, n_train=n, epochs=recipe.epochs, teacher_s=t)
                  for s in (side, FAST_SIDE)}  # fmt: skip
            say(faster_side_line(side=side, epochs=recipe.epochs, seconds=at[side], fast_seconds=at[FAST_SIDE]))
    split = memory_split(cfg, recipe, model_config=mc, dist=here.dist, device=here.device, num_classes=num_classes,
                         teacher=teacher, resumed=resumed)  # fmt: skip
    say(split.line)
    step_macs = train_step_macs(count_macs(mc), split.micro)
    if saved is not None and saved.replayed:
        threads = fix_threads(saved.threads, device=here.device)
    else:
        threads = set_threads(cfg, device=here.device, step_macs=step_macs).threads
    workers = workers_for(cfg, device=here.device, steps_per_epoch=len(data.train) // split.recipe.batch_size)
    say(threads_line(cfg, device=here.device, workers=workers, step_macs=step_macs))
    return Sizing(
        recipe=split.recipe, chosen=chosen, storage=getattr(data, "storage", None), micro=split.micro,
        eval_batch=split.eval_batch, threads=threads, workers=workers, pace=pace, lines=tuple(lines),
        replayed=saved.replayed if saved is not None else None, model=mc,
        plan=saved.plan if saved is not None and saved.replayed else None,  # a replay keeps its plan (see plan())
    )  # fmt: skip


def recipe_for(
    cfg: TrainConfig, data: Any, *, init: ViTConfig | None = None, device_type: str = "cpu", pace: Pace | None = None,
    processes: int = 1,
) -> tuple[Recipe, str | None, str | None]:  # fmt: skip
    """``(recipe, chosen, off)``: the recipe the run ``cfg`` trains with on ``data`` by the rule for what it learns
    (:func:`~vitlab.train.conf.train_config.objective_name`): masked patch prediction's patch and batch; a fine-tune's
    auto recipe for its ``--init`` model (``init``: its configuration); else a classifier's (the auto recipe, from a
    measured ``pace`` under a time budget; the paper's ``finetune`` recipe's batch); then the side and evaluation crop
    the data was stored for (:func:`~.side.sized_recipe`) and what ``--pack`` turns off. ``chosen`` says how the
    recipe was fitted (None: as asked), ``off`` what ``--pack`` turned off (None: nothing)."""
    n_train, size = len(data.train), tuple(int(s) for s in data.image_size)
    if objective_name(cfg) == "mpp":
        recipe, chosen = mpp_recipe(cfg, n_train=n_train, image_size=size, recipe=sized_recipe(cfg.recipe, cfg, data))
    elif init is not None and cfg.recipe.name == "auto":
        recipe, chosen = finetune_recipe(
            cfg, n_train=n_train, class_names=list(data.class_names), in_chans=data.in_chans,
            device_type=device_type, init=init, processes=processes, photos=holds_photos(data), pace=pace,
            stored=sized_recipe(cfg.recipe, cfg, data).img_size,
        )  # fmt: skip
    else:
        recipe, chosen = classify_recipe(
            cfg, n_train=n_train, image_size=size, num_classes=data.num_classes, in_chans=data.in_chans,
            device_type=device_type, pace=pace, photo_data=holds_photos(data),
        )  # fmt: skip
    recipe, off = pack_recipe(cfg, sized_recipe(recipe, cfg, data))
    return recipe, chosen, off


def plan(
    sizing: Sizing,
    cfg: TrainConfig,
    *,
    here: Here,
    net: Any,
    run_net: Any,
    loaders: Any,
    objective: Any,
    replans: tuple = (),
    log: Callable[[str], None] = print,
) -> tuple[Sizing, Replanner]:
    """``sizing`` with the run's plan of steps (:func:`~.budget.plan_run`: the recipe's epochs, or what the time
    budget buys, measured on the run's own model and loaders), and the :class:`~.budget.Replanner` that keeps it on
    the budget. A replayed sizing keeps its plan, and its replanner makes the ``replans`` it recorded. The plan's
    lines are printed through ``log`` and added to :attr:`Sizing.lines`."""
    r = sizing.recipe
    if sizing.replayed and sizing.plan is not None:
        return sizing, Replanner.replaying(dataclasses.replace(sizing.plan, replans=tuple(replans)))
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        log(line)

    run_plan, replanner = plan_run(cfg, r, here, net=net, run_net=run_net, loaders=loaders, objective=objective,
                                   lr=r.scaled_lr(r.batch_size), log=say, pace=sizing.pace)  # fmt: skip
    return dataclasses.replace(sizing, plan=run_plan, lines=(*sizing.lines, *said)), replanner
