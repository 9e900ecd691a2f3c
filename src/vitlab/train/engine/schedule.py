"""Everything that changes with the optimizer step, in one object (modded-nanogpt's ``TrainingSchedule.lookup``):
:class:`StepSchedule` answers "what does step s look like" (:class:`Step`):

- **the learning rate**: linear warmup, then cosine or linear decay (Appendix B.1), or constant;
- **the resolution** (``--res-schedule 24:0.5,32:1.0``): coarser images, so fewer tokens, early in training and the
  full grid late. A ViT takes any grid at run time: learned position embeddings are resampled on the fly
  (:func:`vitlab.models.resample_posemb`, Sec. 3.2), so one model trains at every size. Training below the test
  resolution is the FixRes effect (Touvron et al. 2019); growing it is fast.ai's progressive resizing and
  EfficientNetV2's progressive learning (Tan & Le 2021). Evaluation and the saved model use the final size;
- **token dropping** (``--token-drop R --token-drop-until F``): PatchDropout (Liu et al. 2022) for the first
  fraction ``F`` of the steps, every token for the rest: FLIP's unmasked tuning (Li et al. 2023), so that the model
  meets the full sequences it is evaluated on before training ends;
- **the head-only phase** (``--head-warmup STEPS``, LP-FT, Kumar et al. 2022): the first steps train the head only.
- **the warm start** (``--mpp-warmup F``): masked patch prediction (Sec. 4.6) for the first fraction ``F`` of the
  steps, on every token, then classification (:mod:`vitlab.train.objectives.warmstart`).

Every phase is a fraction (or a count) of the planned steps: when a time budget re-plans the run
(:meth:`StepSchedule.stretch`), each moves with the plan's end. The trainer applies what :meth:`~StepSchedule.lookup`
says: the LR through a ``LambdaLR`` whose lambda is the schedule's :class:`LRFactor` (its numbers are the
scheduler's state in ``last.pt``), the size to each batch, the rest after each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..conf.phases import mean_cost, size_at, warmup_for
from ..conf.recipes import Recipe

__all__ = ["LRFactor", "Step", "StepSchedule", "lr_factor", "resize_batch"]


@dataclass(frozen=True)
class Step:
    """What optimizer step ``s`` (0-based) looks like."""

    lr_factor: float
    """The multiplier of the peak LR."""
    img_size: int | None
    """The side of the training images (None: the model's own, no resolution schedule)."""
    token_drop_rate: float
    """The share of patch tokens dropped in training."""
    head_only: bool
    """Whether only the classifier head trains."""
    warm_start: bool = False
    """Whether the step is in the masked-patch-prediction warm start (``--mpp-warmup``)."""


def lr_factor(
    step: int, *, total_steps: int, warmup_steps: int, schedule: str = "cosine", min_ratio: float = 0.0
) -> float:
    """Multiplier of the peak LR at ``step`` (0-based): ``(step + 1) / warmup`` during warmup,
    then cosine / linear from 1 down to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    t = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * t)) if schedule == "cosine" else 1.0 - t
    return min_ratio + (1 - min_ratio) * shape


class LRFactor:
    """:func:`lr_factor` as the lambda of a ``LambdaLR``, which keeps its ``__dict__`` (plain numbers) in its
    ``state_dict``: ``last.pt`` holds the schedule, and a resumed run reads it back.

    A time budget's re-plan moves the end of a running schedule (:meth:`replan_from`) without a jump in the LR: from
    the step it is made at (the *anchor*), a warmup still running goes on linearly from the factor it had reached to
    1 at its new end, and a decay goes on from where it was (the cosine's phase at the anchor) to its end at the new
    total, stretched or squeezed. So the LR is continuous at every re-plan, and never rises after the warmup."""

    anchor_step: int = 0
    """The step of the last re-plan (0: none; class defaults, so that a schedule saved without them reads back)."""
    anchor_factor: float = 0.0
    """The factor at :attr:`anchor_step` (what a re-fitted warmup starts from)."""
    anchor_t: float = 0.0
    """The decay's progress (0 at its start, 1 at its end) at :attr:`anchor_step`."""
    peak: float = 1.0
    """The factor the decay starts from: 1, or less when a re-plan ended the warmup before it reached the peak."""

    def __init__(self, *, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> None:
        self.total_steps, self.warmup_steps, self.schedule, self.min_ratio = (
            total_steps,
            warmup_steps,
            schedule,
            min_ratio,
        )

    def __call__(self, step: int) -> float:
        if self.anchor_step <= 0:  # never re-planned: the plain schedule
            return lr_factor(
                step,
                total_steps=self.total_steps,
                warmup_steps=self.warmup_steps,
                schedule=self.schedule,
                min_ratio=self.min_ratio,
            )
        a, w = self.anchor_step, self.warmup_steps
        if step < w:
            if step >= a:  # the re-fitted warmup: from the factor reached at the anchor to 1 at its new end
                return self.anchor_factor + (1 - self.anchor_factor) * (step - a) / max(1, w - a)
            return (step + 1) / w
        if self.schedule == "constant":
            return self.peak
        t = self._progress(step)
        shape = 0.5 * (1 + math.cos(math.pi * t)) if self.schedule == "cosine" else 1.0 - t
        return self.min_ratio + (self.peak - self.min_ratio) * shape

    def _progress(self, step: int) -> float:
        """The decay's progress at ``step`` (0 at its start, 1 at the end), from the anchor when it is in the decay."""
        a, w = self.anchor_step, self.warmup_steps
        t0, s0 = (self.anchor_t, a) if a > 0 and a >= w else (0.0, w)
        return min(1.0, t0 + (1 - t0) * (step - s0) / max(1, self.total_steps - s0))

    def replan_from(self, step: int, total_steps: int, *, warmup_steps: int) -> None:
        """Re-plan at ``step`` (the next step's index) to end at ``total_steps``, the LR continuous at ``step``.
        ``warmup_steps``: the warmup the new plan asks for, used only while the warmup is still running: it then
        ends there (from the factor reached, linearly), or here, at a lower peak, when the new plan's warmup has
        already passed. After the warmup, the warmup is kept and the decay re-fitted from its progress here."""
        now = self(step)
        if step < self.warmup_steps:  # still warming up
            if warmup_steps > step:
                self.warmup_steps, self.anchor_t = warmup_steps, 0.0
            else:  # the new plan's warmup is over: decay from here, from the factor reached
                self.warmup_steps, self.anchor_t, self.peak = step, 0.0, now
        else:
            self.anchor_t = self._progress(step)
        self.anchor_step, self.anchor_factor, self.total_steps = step, now, total_steps


def resize_batch(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` ``(B, C, H, W)`` resized to ``size`` x ``size`` (bilinear, antialiased when shrinking); as is when
    it already has that size."""
    if x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)


class StepSchedule:
    """The run's steps (see the module's notes): the ``recipe``'s phases over ``lr.total_steps`` planned optimizer
    steps; ``lr``: the learning-rate factor the optimizer's ``LambdaLR`` calls (None: the recipe's, fitted to the
    plan by :meth:`stretch` before the optimizer is built)."""

    def __init__(self, recipe: Recipe, *, lr: LRFactor | None = None) -> None:
        self.recipe = recipe
        self.lr = lr or LRFactor(total_steps=0, warmup_steps=0, schedule=recipe.schedule, min_ratio=recipe.min_lr_ratio)

    @property
    def total_steps(self) -> int:
        return self.lr.total_steps

    def replan_from(self, step: int, total_steps: int, *, steps_per_epoch: int) -> int:
        """Re-plan a running schedule at ``step`` to end at ``total_steps``, the LR continuous there
        (:meth:`LRFactor.replan_from`): a warmup still running ends where the new plan's would
        (:func:`~vitlab.train.conf.phases.warmup_for`), going on from the LR it reached; a finished one is kept and
        the decay re-fitted from where it is. Every phase moves with the new end. Returns the warmup's length."""
        wanted, _ = warmup_for(self.recipe, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
        self.lr.replan_from(step, total_steps, warmup_steps=wanted)
        return self.lr.warmup_steps

    def stretch(self, total_steps: int, *, warmup_steps: int | None = None) -> None:
        """Stretch or shrink every phase so that the run ends at optimizer step ``total_steps`` (and, when given,
        the LR warmup ends at ``warmup_steps``)."""
        self.lr.total_steps = total_steps
        if warmup_steps is not None:
            self.lr.warmup_steps = warmup_steps

    def lookup(self, step: int) -> Step:
        """What optimizer step ``step`` (0-based) looks like."""
        r, total = self.recipe, self.total_steps
        size = size_at(r.res_schedule, step=step, total_steps=total) if r.res_schedule else None
        warm = step < self.warm_start_switch()
        dropping = not warm and (r.token_drop_until >= 1 or step < round(r.token_drop_until * total))
        return Step(
            lr_factor=self.lr(step),
            img_size=size,
            token_drop_rate=r.token_drop if dropping else 0.0,
            head_only=step < r.head_warmup,
            warm_start=warm,
        )

    def token_drop_switch(self) -> int | None:
        """The first step (0-based) that trains on every token after dropping them (``--token-drop-until``); None
        when tokens are dropped to the end (or never)."""
        r = self.recipe
        return round(r.token_drop_until * self.total_steps) if r.token_drop and r.token_drop_until < 1 else None

    def warm_start_switch(self) -> int:
        """The first step (0-based) after the masked-patch-prediction warm start (0: none)."""
        return round(self.recipe.mpp_warmup * self.total_steps)

    def mean_cost(self, *, full_over_dropped: float = 1.0) -> float:
        """The mean cost of the planned steps relative to the step a time budget's probe times
        (:func:`~vitlab.train.conf.phases.mean_cost`)."""
        return mean_cost(self.recipe, full_over_dropped=full_over_dropped)
