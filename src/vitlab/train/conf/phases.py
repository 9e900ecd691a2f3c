"""The phases of a recipe over its planned steps (no torch): the LR warmup, the resolution schedule's sizes and their
cost, the end of token dropping and the masked-patch-prediction warm start. Every phase is a fraction (or a count) of
the planned steps, so each moves with the plan's end. The step schedule applies them
(:class:`~vitlab.train.engine.schedule.StepSchedule`) and a time budget counts them
(:mod:`vitlab.train.sizing.budget`): one definition for both."""

from __future__ import annotations

from .kinds import Schedule
from .options import OptionError, ref
from .recipes import Recipe

__all__ = [
    "FIXED_COST",
    "check_res_sizes",
    "ends_dropping",
    "last_stretch_from",
    "mean_cost",
    "size_at",
    "step_cost",
    "unmasked_phases",
    "warmup_for",
]


def warmup_for(recipe: Recipe, *, total_steps: int, steps_per_epoch: int) -> tuple[int, int]:
    """``(warmup steps, steps the recipe asks for)`` in a run of ``total_steps``: the recipe's
    ``warmup_steps``, else ``warmup_epochs``, else ``warmup_fraction`` of the run, capped at half the
    run so that the schedule always decays. A re-plan calls it again with its new total, so that
    the warmup ends where it should in the run that will actually happen."""
    wanted = (
        recipe.warmup_steps
        or round(recipe.warmup_epochs * steps_per_epoch)
        or round(recipe.warmup_fraction * total_steps)
    )
    return min(wanted, total_steps // 2), wanted


def size_at(schedule: Schedule, *, step: int, total_steps: int) -> int:
    """The image size for optimizer step ``step`` (0-based) of ``total_steps``."""
    frac = step / max(total_steps, 1)
    for size, end in schedule:
        if frac < end:
            return size
    return schedule[-1][0]


FIXED_COST = 0.25
"""The share of a full-size training step that does not shrink with the image (data, the optimizer, launch
overheads) in :func:`step_cost`'s model, set from the speedrun's 24 px and 32 px steps (docs/speedrun.md) and
erring towards fewer steps, so that a budgeted run ends on time."""


def step_cost(size: int, *, final: int) -> float:
    """The cost of a training step at ``size`` px relative to one at ``final`` px: the fixed share plus the rest
    in proportion to the pixels (the number of tokens)."""
    return FIXED_COST + (1 - FIXED_COST) * (size / final) ** 2


def ends_dropping(recipe: Recipe) -> bool:
    """Whether the recipe drops tokens but not in every planned step: it stops before the end
    (``token_drop_until`` < 1), or starts after a masked-patch-prediction warm start, which sees every token."""
    return bool(recipe.token_drop) and (recipe.token_drop_until < 1 or recipe.mpp_warmup > 0)


def last_stretch_from(recipe: Recipe) -> float:
    """The share of the planned steps where the run's last stretch of one step cost begins (0: every step costs
    the same): the last size of ``--res-schedule``, the masked-patch-prediction warm start's end, the token-drop
    end, whichever comes last. A time budget times its own pace there
    (:class:`~vitlab.train.sizing.budget.Replanner`)."""
    sizes = recipe.res_schedule or ()
    marks = [sizes[-2][1]] if len(sizes) > 1 else []
    marks += [recipe.mpp_warmup] if recipe.mpp_warmup else []
    marks += [recipe.token_drop_until] if recipe.token_drop and recipe.token_drop_until < 1 else []
    return max(marks, default=0.0)


def unmasked_phases(recipe: Recipe) -> str:
    """Which planned steps see every token in a recipe that drops tokens (:func:`ends_dropping`), in words: "the
    first 10% (the warm start)", "the last 20%", or both."""
    phases = [f"the first {recipe.mpp_warmup:.0%} (the warm start)"] if recipe.mpp_warmup else []
    if recipe.token_drop_until < 1:
        phases.append(f"the last {1 - recipe.token_drop_until:.0%}")
    return " and ".join(phases)


def mean_cost(recipe: Recipe, *, full_over_dropped: float = 1.0) -> float:
    """The mean cost of the planned steps of ``recipe`` relative to the step a time budget's probe times (at the
    final size, dropping tokens): what the budget multiplies that step's time by to plan the run's length.
    ``full_over_dropped``: the measured cost of a step on every token relative to one that drops."""
    r, cost = recipe, 1.0
    if r.res_schedule:
        final, start, mean = r.res_schedule[-1][0], 0.0, 0.0
        for size, end in r.res_schedule:
            mean += (end - start) * step_cost(size, final=final)
            start = end
        cost *= mean
    if ends_dropping(r):  # the steps from the warm start's end to token_drop_until drop, the others do not
        dropped = max(0.0, r.token_drop_until - r.mpp_warmup)
        cost *= dropped + (1 - dropped) * full_over_dropped
    return cost


def check_res_sizes(schedule: Schedule, *, final: tuple[int, int], multiple: int, dynamic_pad: bool = False) -> None:
    """Refuse a resolution schedule whose last size is not the model's (evaluation) size ``final``, or with a size
    the patch size (times a hybrid's stride) ``multiple`` does not divide."""
    if (schedule[-1][0],) * 2 != tuple(final):
        raise OptionError(
            ref("recipe.res_schedule"),
            f": ends at {schedule[-1][0]} px but the model is built for {final[0]}x{final[1]}; "
            f"end the schedule at {final[0]} or pass ",
            ref("img_size"),
            f" {schedule[-1][0]}",
        )
    for size, _ in schedule:
        if size % multiple and not dynamic_pad:
            raise OptionError(ref("recipe.res_schedule"), f": {size} px is not divisible by the patch size {multiple}")
