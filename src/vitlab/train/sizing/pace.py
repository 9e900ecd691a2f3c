"""The arithmetic of a ``--time-budget`` (no torch): how many optimizer steps fit in the seconds left
(:func:`steps_in_budget`), what a measured probe says a step of another model or augmentation level costs
(:class:`Pace`), and the line that says when a budget cannot buy a meaningful run (:func:`short_budget_line`).

The auto recipe (:mod:`vitlab.train.sizing.recipe`) chooses its augmentation level, batch and model from a
:class:`Pace` measured on the run's own data before anything is chosen (:mod:`vitlab.train.sizing.probe`), and
the run's plan (:mod:`vitlab.train.sizing.budget`) counts steps with the same :func:`steps_in_budget`, so that the
passes the auto line states are the passes the run plans."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["LOGGING_SHARE", "Pace", "budget_reserve", "short_budget_line", "steps_in_budget"]

LOGGING_SHARE = 1.03
"""A training step in the run costs about 3% more than the same step in a probe (logging, the progress bar)."""
SAVE_S = 0.5
"""Seconds of saving (``last.pt``) counted with each end-of-epoch evaluation."""


def budget_reserve(budget: float) -> float:
    """Seconds kept back from a time budget for the final save and figures."""
    return min(5.0, 0.1 * budget)


def steps_in_budget(left: float, per_step: float, eval_s: float, steps_per_epoch: int, done: int = 0) -> int:
    """How many more optimizer steps fit in ``left`` seconds after ``done`` steps: ``per_step`` each,
    plus one evaluation (``eval_s``, plus :data:`SAVE_S` for saving) at the end of every epoch they finish or start.

    The answer is the largest ``n`` from 1 to ``left / per_step`` whose cost fits (1 when none does). The cost
    grows with ``n`` (in floating point too: rounding is monotonic), so a bisection finds it in O(log n) steps:
    a budget of years plans as fast as one of minutes."""

    def cost(n: int) -> float:
        return n * per_step + (math.ceil((done + n) / steps_per_epoch) - done // steps_per_epoch) * (eval_s + SAVE_S)

    lo, hi = 1, max(1, int(left / per_step))  # cost(lo) fits, or lo is the answer anyway; the answer is <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) > left:
            hi = mid - 1
        else:
            lo = mid
    return lo


@dataclass(frozen=True, kw_only=True)
class Pace:
    """What a probe measured on the run's own data, in this process, before the recipe is chosen: a few training
    steps of one model (the smallest the auto recipe would pick), each augmentation level's transform on real
    training items, and an evaluation pass. Other models' steps are scaled from the probed one by their
    multiply-accumulates (:meth:`step_s`), so one probe serves every candidate."""

    step_s: float
    """Seconds of one optimizer step of the probed model on ``batch`` images (forward, backward, AdamW)."""
    step_macs: float
    """Multiply-accumulates of that step (3 x the forward's, with the token dropping it trains with)."""
    batch: int
    aug_s: dict[str, float] = field(default_factory=dict)
    """Seconds per image of each augmentation level's training transform (a :data:`~.levels.LEVELS` key)."""
    workers: int = 0
    """DataLoader workers of the run: with any, augmentation runs beside the steps, else before each one."""
    eval_s: float = 0.0
    """Seconds of one evaluation of the whole evaluation split with the probed model."""
    eval_image_macs: float = 1.0
    """Forward multiply-accumulates of the probed model on one evaluation image (every token)."""
    n_eval: int = 0
    """Images of the evaluation split."""
    elapsed_s: float = 0.0
    """Seconds of the run spent when the probe ended (the budget's part already used)."""
    probe: str = ""
    """What was probed, for the auto recipe's line (e.g. ``"model tiny, 32 images"``)."""
    arch: dict = field(default_factory=dict)
    """The probed model's fields, so that the run's own probe can reuse :attr:`step_s` for the same model."""

    def per_step(self, *, level: str, step_macs: float, batch: int) -> float:
        """Seconds of one optimizer step of ``batch`` images costing ``step_macs`` at augmentation ``level``, as the
        run will take it: the compute scaled from the probe, and the augmentation added (no workers) or beside it
        (workers: whichever of the two is slower sets the pace)."""
        compute = self.step_s * step_macs / self.step_macs
        aug = batch * self.aug_s.get(level, 0.0)
        return (compute + aug if self.workers == 0 else max(compute, aug / self.workers)) * LOGGING_SHARE

    def evaluation_s(self, image_macs: float) -> float:
        """Seconds of one evaluation of the split with a model of ``image_macs`` forward multiply-accumulates an
        image."""
        return self.eval_s * image_macs / self.eval_image_macs


def short_budget_line(
    *, budget: float, left: float, per_step: float, eval_s: float, steps_per_epoch: int, steps: int, n_eval: int
) -> str | None:
    """One line when ``steps`` planned in a ``budget`` of seconds (``left`` of them for training and evaluation)
    cannot make a meaningful run, else None: fewer than one pass over the data, or evaluation taking more than half
    of the time. It proposes the budget that buys three epochs with their evaluations in at most half of it (whole
    minutes) when that is a longer budget, and, when evaluation dominates, an evaluation split small enough to take a
    quarter of an epoch's time. It says only what the plan it was made from does: a run of many short epochs is not
    told that its budget "buys only" them."""
    passes = steps / steps_per_epoch
    evals = math.ceil(passes) * (eval_s + SAVE_S)
    if passes >= 1 and evals <= 0.5 * left:
        return None
    spent = budget - left - budget_reserve(budget)
    epoch_s = steps_per_epoch * per_step + eval_s + SAVE_S
    run = max(3 * epoch_s, 6 * (eval_s + SAVE_S))  # 3 epochs, their evaluations at most half of the time
    need = spent + run + budget_reserve(spent + run)
    minutes = max(1, math.ceil(need / 60))
    timing = f"({eval_s:.1f} s each, {steps_per_epoch} steps an epoch at {per_step * 1000:.0f} ms)"
    if passes < 1:
        line = (
            f"warning: --time-budget {_duration(budget)} buys only {passes:.2f} passes over the training data, and "
            f"evaluation takes {evals:.0f} s of the {max(0.0, left):.0f} s left {timing}"
        )
    else:
        line = (
            f"warning: evaluation takes {evals:.0f} s of the {max(0.0, left):.0f} s left: {math.ceil(passes)} "
            f"evaluations in {passes:.1f} passes {timing}"
        )
    more = minutes * 60 > budget
    if more:
        line += f": --time-budget {minutes}m buys about 3 epochs"
    if evals > 0.5 * left and eval_s > 0:
        keep = max(1, int(n_eval * 0.25 * steps_per_epoch * per_step / eval_s))
        if keep < n_eval:
            line += (", or" if more else ":") + f" evaluate on fewer images (an evaluation folder of ~{keep:,} of the "
            line += f"{n_eval:,})"
    return line


def _duration(seconds: float) -> str:
    """``120`` -> ``2m``, ``90`` -> ``90s``: how a user would write the budget."""
    return f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"
