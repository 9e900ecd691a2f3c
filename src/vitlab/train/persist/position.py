"""Where a run is (:class:`RunPosition`): what ``last.pt`` keeps of it as plain numbers (it loads with
``torch.load(weights_only=True)``), beside its plan (:class:`~vitlab.train.sizing.budget.RunPlan`), so that
``--resume`` continues exactly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["EpochSoFar", "RunPosition"]


class EpochSoFar(Protocol):
    """What this process's epoch has done so far (:class:`~vitlab.train.engine.loop.EpochResult`)."""

    images: int
    micro_batches: int
    loss_sum: float
    counted: int
    skipped: int
    tokens: int
    slots: int


@dataclass(kw_only=True)
class RunPosition:
    """Where the run is. The first group is saved in ``last.pt`` (as plain numbers) and restored on resume; the
    second describes the epoch in progress; the last counts what this process did."""

    epoch: int = 0
    """Epochs completed."""
    step: int = 0
    """Optimizer steps completed (all epochs)."""
    best: float = -1.0
    """Best evaluation top-1 so far (-1: none yet)."""
    wall_before: float = 0.0
    """Wall seconds of the processes that ran this run before this one."""
    images: int = 0
    """Training images seen, all processes together."""
    train_s: float = 0.0
    """Seconds spent in training epochs (not evaluation): ``images / train_s`` is the throughput."""

    micro: int = 0
    """Micro-batches done in the epoch in progress."""
    loss_sum: float = 0.0
    """The training-loss sum of those of the steps taken (a step skipped for a NaN/Inf loss is not in it) ..."""
    loss_count: int = 0
    """... and how many micro-batches it sums: the epoch's ``train_loss`` is ``loss_sum / loss_count``."""
    skipped: int = 0
    """Optimizer steps of the epoch in progress skipped for a NaN/Inf loss (``--on-nan skip``)."""
    tokens: int = 0
    """Packed batches (``--pack``): the token slots of the epoch that held an image, this process's since it
    started (rank 0's with the saved epoch's too) ..."""
    slots: int = 0
    """... of all its sequences' slots (the rest is padding)."""
    epoch_start_micro: int = 0
    epoch_start_images: int = 0
    epoch_start_skipped: int = 0

    steps_this_run: int = 0
    saved_step: int | None = None
    """The step ``last.pt`` holds (None: nothing saved yet)."""
    interrupted: bool = False

    def start_epoch(self) -> None:
        """Remember where the epoch in progress (re)starts: at its beginning, or part-way after a resume."""
        self.epoch_start_micro, self.epoch_start_images = self.micro, self.images
        self.epoch_start_skipped = self.skipped

    def took_step(self, res: EpochSoFar, *, world_size: int) -> None:
        """One more optimizer step, the epoch's counts now those of ``res`` (the loss sum went on from the saved
        one: the same additions as an uninterrupted run)."""
        self.step += 1
        self.steps_this_run += 1
        self.images = self.epoch_start_images + res.images * world_size
        self.micro = self.epoch_start_micro + res.micro_batches
        self.loss_sum, self.loss_count = res.loss_sum, res.counted
        self.skipped = self.epoch_start_skipped + res.skipped
        self.tokens, self.slots = res.tokens, res.slots

    def finish_epoch(self) -> None:
        self.epoch += 1
        self.micro, self.loss_sum, self.tokens, self.slots = 0, 0.0, 0, 0
        self.loss_count = self.skipped = 0

    def kept(self, path: Path) -> str:
        """What a run stopped by an error leaves to resume from, for the error's message."""
        if self.saved_step is None:
            return "no checkpoint was saved yet"
        return f"{path} (step {self.saved_step}) holds the last good state"
