"""One training epoch: for each micro-batch, the objective's loss (at the size the step schedule gives), backward;
every ``accum_steps`` micro-batches one optimizer step (clipped, scaled, averaged into the EMA) and one step of the
LR schedule, then the trainer's callback. A NaN or Inf loss stops before the update or skips it."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ...devices import autocast
from ...distributed import Dist, any_rank
from ...errors import NonFiniteLossError
from ..conf.recipes import Recipe
from ..objectives import Objective
from .optim import Optimization

__all__ = ["EpochResult", "StepParts", "train_epoch"]


@dataclass
class EpochResult:
    loss_sum: float = 0.0
    """The training losses of the micro-batches of the steps taken (a skipped step's are left out) ..."""
    counted: int = 0
    """... and how many they are: the epoch's training loss is ``loss_sum / counted`` (none: no step was taken)."""
    micro_batches: int = 0
    images: int = 0
    steps: int = 0
    seconds: float = 0.0
    stopped: bool = False
    """True when ``on_step`` asked to stop before the end of the epoch."""
    skipped: int = 0
    """Optimizer steps skipped because the loss was NaN or Inf (``on_nan="skip"``)."""
    tokens: int = 0
    """Packed batches: the token slots that held an image (prefix or patch) ..."""
    slots: int = 0
    """... of all the slots of the sequences (the rest is padding)."""


@dataclass(kw_only=True)
class StepParts:
    """What one optimizer step needs: ``net`` (the module the steps call: DDP, FSDP or compiled around the trained
    one), the ``objective`` (the loss), ``opt`` (optimizer, LR scheduler, gradient scaler, EMA), the ``recipe``
    (its accumulation steps and clipping), MixUp/CutMix (``mix``), and what a NaN/Inf loss does (``on_nan``)."""

    net: nn.Module
    objective: Objective
    opt: Optimization
    recipe: Recipe
    device: torch.device
    amp_dtype: torch.dtype | None = None
    mix: Callable | None = None
    on_nan: str = "stop"
    dist: Dist | None = None
    """The process group: a step one rank finds non-finite is skipped (or stops the run) on every rank, which all
    hold the same all-reduced gradients."""


def train_epoch(
    parts: StepParts,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    step_input: Callable[[Any], tuple[Any, int, int]] = lambda x: (x, 0, 0),
    on_step: Callable[[EpochResult, float], bool] | None = None,
    loss_sum: float = 0.0,
    counted: int = 0,
    packed: tuple[int, int] = (0, 0),
) -> EpochResult:
    """Train over ``batches``; one optimizer step (and one scheduler step) every ``accum_steps`` micro-batches.
    ``step_input(x)``: a micro-batch's input as the coming step takes it, with its ``(tokens, slots)`` (the loaders'
    :meth:`~vitlab.train.engine.loaders.RunLoaders.step_input`: the loop never asks which kind it is). ``on_step(result,
    loss)`` runs after each optimizer step; returning True stops the epoch there. A NaN/Inf loss raises
    :class:`~vitlab.errors.NonFiniteLossError` before the update (``on_nan="stop"``) or skips that optimizer step
    and counts it in ``skipped`` (``"skip"``); a skipped step's losses are not in ``loss_sum`` (the mean is of the
    steps taken, never a NaN averaged in as 0), and ``on_step`` gets NaN for its loss. Under a process group every
    rank takes the same decision. ``loss_sum`` and ``counted``: the epoch's loss sum so far and the micro-batches in
    it (a run resumed mid-epoch), which ``result.loss_sum`` and ``result.counted`` go on from: the same additions in
    the same order as a run that never stopped, so the epoch's mean loss is the same bit for bit; ``packed``: the
    epoch's ``(tokens, slots)`` so far, which ``result.tokens`` and ``result.slots`` go on from (packed batches:
    :class:`~vitlab.models.packed.PackedPatches`, one row of logits per image)."""
    p, net, opt, accum = parts, parts.net, parts.opt, parts.recipe.accum_steps
    net.train()
    res = EpochResult(loss_sum=loss_sum, counted=counted, tokens=packed[0], slots=packed[1])
    bad_step = False
    t0 = time.perf_counter()
    step_losses: list[float] = []  # the finite losses of the step's micro-batches so far
    group = p.dist if p.dist is not None and p.dist.enabled else None
    for i, (x, y) in enumerate(batches):
        x, y = x.to(p.device, non_blocking=True), y.to(p.device, non_blocking=True)
        x, tokens, slots = step_input(x)
        res.tokens += tokens
        res.slots += slots
        if p.mix is not None:
            x, y = p.mix(x, y)
        last_micro = (i + 1) % accum == 0
        sync = contextlib.nullcontext() if last_micro or not hasattr(net, "no_sync") else net.no_sync()
        with sync:
            with autocast(p.device, p.amp_dtype):
                loss = p.objective.loss(net, x, y)
            (opt.scaler.scale(loss / accum) if opt.scaler else loss / accum).backward()
        lv = float(loss.detach())
        if not np.isfinite(lv):
            if p.on_nan != "skip" and group is None:  # before the optimizer step: the weights are the last good ones
                raise NonFiniteLossError(f"the training loss is {lv} (step {res.steps + 1} of this epoch)")
            bad_step = True
        else:
            step_losses.append(lv)
        res.micro_batches += 1
        res.images += len(y)
        if not last_micro:
            continue
        if group is not None:  # every rank holds the all-reduced gradients: one decision for all
            bad_step = any_rank([bad_step], group)[0]
            if bad_step and p.on_nan != "skip":
                raise NonFiniteLossError(f"the training loss is not finite (step {res.steps + 1} of this epoch)")
        if bad_step:  # skip the update, keep the schedule and the step count (as GradScaler does with fp16 overflows)
            if opt.scaler is None:
                opt.optimizer.zero_grad(set_to_none=True)  # params without gradients are not updated
            res.skipped += 1
            step_loss = math.nan
        else:
            for lv in step_losses:  # in order: the additions of an uninterrupted run
                res.loss_sum += lv
            res.counted += len(step_losses)
            step_loss = sum(step_losses) / accum
        bad_step, step_losses = False, []
        _update(parts)
        res.steps += 1
        res.seconds = time.perf_counter() - t0
        if on_step is not None and on_step(res, step_loss):
            res.stopped = True
            break
    if step_losses and not bad_step:  # micro-batches after the last whole step (no update of their own)
        for lv in step_losses:
            res.loss_sum += lv
        res.counted += len(step_losses)
    res.seconds = time.perf_counter() - t0
    return res


def _update(parts: StepParts) -> None:
    """The optimizer step from the accumulated gradients: unscaled, clipped, stepped; the LR schedule's step and
    the EMA's update."""
    opt = parts.opt
    if opt.scaler:
        opt.scaler.unscale_(opt.optimizer)
    if parts.recipe.clip_grad:
        nn.utils.clip_grad_norm_(parts.net.parameters(), parts.recipe.clip_grad)
    if opt.scaler:
        opt.scaler.step(opt.optimizer)
        opt.scaler.update()
    else:
        opt.optimizer.step()
    opt.optimizer.zero_grad(set_to_none=True)
    opt.scheduler.step()
    if opt.ema is not None:
        opt.ema.update_parameters(parts.net)
