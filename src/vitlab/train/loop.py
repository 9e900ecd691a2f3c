"""One training epoch, one evaluation pass, and Ctrl-C as a request to stop after the current step.
The run around them (data, checkpoints, reports) is :mod:`vitlab.train.trainer`."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..devices import autocast
from ..errors import NonFiniteLossError
from ..evaluate.accuracy import evaluate_batches as evaluate

__all__ = ["EpochResult", "SigintStop", "evaluate", "train_one_epoch"]


@dataclass
class EpochResult:
    loss_sum: float = 0.0
    micro_batches: int = 0
    images: int = 0
    steps: int = 0
    seconds: float = 0.0
    stopped: bool = False
    """True when ``on_step`` asked to stop before the end of the epoch."""
    skipped: int = 0
    """Optimizer steps skipped because the loss was NaN or Inf (``on_nan="skip"``)."""


def train_one_epoch(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    device: torch.device,
    label_smoothing: float = 0.0,
    mix: Callable | None = None,
    accum_steps: int = 1,
    clip_grad: float | None = None,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    ema: torch.optim.swa_utils.AveragedModel | None = None,
    on_step: Callable[[EpochResult, float], bool] | None = None,
    on_nan: str = "stop",
) -> EpochResult:
    """Train over ``batches``; one optimizer step (and one scheduler step) every ``accum_steps``
    micro-batches. ``on_step(result, loss)`` runs after each optimizer step; returning True stops
    the epoch there (time budget, ``--stop-after``, periodic checkpoints are the caller's business).
    A NaN/Inf loss raises :class:`~vitlab.errors.NonFiniteLossError` before the update
    (``on_nan="stop"``) or skips that optimizer step and counts it in ``skipped`` (``"skip"``).
    Cross-entropy takes MixUp/CutMix's soft targets and label smoothing directly; a model that returns
    an object with a ``.loss`` (:class:`~vitlab.models.mpp.MaskedPatchPrediction`) is trained on that loss."""
    model.train()
    res = EpochResult()
    bad_step = False
    t0 = time.perf_counter()
    running = 0.0
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if mix is not None:
            x, y = mix(x, y)
        last_micro = (i + 1) % accum_steps == 0
        sync = contextlib.nullcontext() if last_micro or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast(device, amp_dtype):
                out = model(x)
            # an objective wrapper (masked patch prediction) returns its own loss and ignores the labels
            loss = (
                F.cross_entropy(out.float(), y, label_smoothing=label_smoothing)
                if isinstance(out, torch.Tensor)
                else out.loss.float()
            )
            (scaler.scale(loss / accum_steps) if scaler else loss / accum_steps).backward()
        lv = float(loss.detach())
        if not np.isfinite(lv):
            if on_nan != "skip":  # before the optimizer step: the weights are still the last good ones
                raise NonFiniteLossError(f"the training loss is {lv} (step {res.steps + 1} of this epoch)")
            bad_step = True
        else:
            res.loss_sum += lv
            running += lv
        res.micro_batches += 1
        res.images += x.shape[0]
        if not last_micro:
            continue
        if bad_step:  # skip the update, keep the schedule and the step count (as GradScaler does with fp16 overflows)
            if scaler is None:
                optimizer.zero_grad(set_to_none=True)  # params without gradients are not updated
            res.skipped += 1
            bad_step = False
        if scaler:
            scaler.unscale_(optimizer)
        if clip_grad:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if ema is not None:
            ema.update_parameters(model)
        res.steps += 1
        res.seconds = time.perf_counter() - t0
        if on_step is not None and on_step(res, running / accum_steps):
            res.stopped = True
            break
        running = 0.0
    res.seconds = time.perf_counter() - t0
    return res


class SigintStop:
    """Ctrl-C in a single-process run: the first asks the run to finish its step, save and stop;
    a second interrupts at once. In a multi-process run Ctrl-C keeps its default effect."""

    def __init__(self, *, active: bool) -> None:
        self.active, self.requested = active, False
        self._prev: Any = None

    def __enter__(self) -> SigintStop:
        if self.active:
            self._prev = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self._prev)

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
