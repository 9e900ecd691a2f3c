"""One training epoch, one evaluation pass, and stop signals (Ctrl-C, SIGTERM, SIGHUP) as a request to stop after
the current step.
The run around them (data, checkpoints, reports) is :mod:`vitlab.train.trainer`."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..devices import autocast
from ..errors import NonFiniteLossError
from ..evaluate.accuracy import evaluate_batches as evaluate
from .objectives import Objective

__all__ = [
    "STOP_SIGNALS",
    "EpochResult",
    "StopSignals",
    "StoppedBeforeTraining",
    "evaluate",
    "ignore_stop_signals",
    "train_one_epoch",
]


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
    objective: Objective,
    mix: Callable | None = None,
    accum_steps: int = 1,
    clip_grad: float | None = None,
    amp_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    ema: torch.optim.swa_utils.AveragedModel | None = None,
    on_step: Callable[[EpochResult, float], bool] | None = None,
    on_nan: str = "stop",
    resize: Callable[[torch.Tensor], torch.Tensor] | None = None,
    loss_sum: float = 0.0,
) -> EpochResult:
    """Train over ``batches``; one optimizer step (and one scheduler step) every ``accum_steps``
    micro-batches. ``on_step(result, loss)`` runs after each optimizer step; returning True stops
    the epoch there (time budget, ``--stop-after``, periodic checkpoints are the caller's business).
    A NaN/Inf loss raises :class:`~vitlab.errors.NonFiniteLossError` before the update
    (``on_nan="stop"``) or skips that optimizer step and counts it in ``skipped`` (``"skip"``).
    The loss is the ``objective``'s (:mod:`vitlab.train.objectives`), which the loop does not look into.
    ``resize`` (progressive resolution) maps each input batch to the size of the current step.
    ``loss_sum``: the epoch's loss sum so far (a run resumed mid-epoch), which ``result.loss_sum`` goes on from: the
    same additions in the same order as a run that never stopped, so the epoch's mean loss is the same bit for bit."""
    model.train()
    res = EpochResult(loss_sum=loss_sum)
    bad_step = False
    t0 = time.perf_counter()
    running = 0.0
    for i, (x, y) in enumerate(batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if resize is not None:
            x = resize(x)
        if mix is not None:
            x, y = mix(x, y)
        last_micro = (i + 1) % accum_steps == 0
        sync = contextlib.nullcontext() if last_micro or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast(device, amp_dtype):
                loss = objective.loss(model, x, y)
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


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
"""Ctrl-C, a scheduler's or ``kill``'s request to end, a closed terminal or SSH session."""


class StoppedBeforeTraining(KeyboardInterrupt):
    """A stop signal that arrived while the run was starting (data, model, plan): there is nothing to
    save yet, so the run ends at once, through every ``finally`` (the run folder's lock is released)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} before training began; nothing to save")
        self.signum = signum


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP as a request to finish the current step, save and stop.

    In a single-process run, a signal that arrives before :meth:`training` is called (the run is
    still starting: data, model, plan) raises :class:`StoppedBeforeTraining` at once, and a second
    signal during training interrupts at once (Ctrl-C twice: :class:`KeyboardInterrupt`; SIGTERM,
    SIGHUP: their default action). Otherwise a signal only sets :attr:`signum`, which the training
    loop reads after each step. Under torchrun (``single_process=False``) every rank listens from
    the start and the ranks agree on stopping (the trainer all-reduces the flag): torchrun forwards
    SIGTERM, SIGINT and SIGHUP to each worker, the workers reach it at different moments, and one
    rank ending alone would break the others' collectives. A repeat is ignored there, because the
    same signal reaches a worker twice (from the terminal and forwarded by torchrun), and torchrun
    kills its workers after its own timeout anyway. A signal that was ignored when the run began
    (``nohup`` ignores SIGHUP) stays ignored. Inactive outside the main thread, where Python cannot
    install handlers."""

    def __init__(self, *, single_process: bool) -> None:
        self.escalate = single_process
        self.signum: int | None = None
        self._training = not single_process
        self._prev: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str | None:
        """The signal that asked to stop, e.g. ``"SIGTERM"`` (None: none did)."""
        return signal.Signals(self.signum).name if self.signum is not None else None

    def training(self) -> None:
        """Training has begun: from now on a signal asks to save and stop instead of ending the run."""
        self._training = True

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                prev = signal.getsignal(s)
                if prev is not signal.SIG_IGN:
                    self._prev[s] = prev
                    signal.signal(s, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, prev in self._prev.items():
            signal.signal(s, prev)
        self._prev.clear()

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._training:
            raise StoppedBeforeTraining(signum)
        if self.signum is None:
            self.signum = signum
            return
        if not self.escalate:
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, self._prev.get(signum, signal.SIG_DFL))  # the default: end the process now
        os.kill(os.getpid(), signum)


def ignore_stop_signals(worker_id: int) -> None:
    """``worker_init_fn`` of the DataLoaders: a signal sent to the whole process group (Ctrl-C, a
    scheduler) must not kill the workers while the training process finishes its step and saves;
    they end with it (:mod:`vitlab.data.loading` ends them, killing those that linger, whatever ends the run)."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
