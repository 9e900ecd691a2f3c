"""Unmasked tuning (``vitlab train --token-drop R --token-drop-until F``): token dropping for the first
fraction ``F`` of the planned optimizer steps, every patch token for the rest.

Token dropping (PatchDropout, Liu et al. 2022) buys steps: each one sees a random ``1 - R`` of the patch
tokens, and evaluation sees all of them. FLIP (Li et al. 2023) ends its masked pre-training with a short
phase without masking ("unmasked tuning"), so that the model meets the full sequences it is evaluated on
before training ends. Here that phase is the last ``1 - F`` of the planned steps; when a time budget
re-plans the run, the switch moves with the plan's end.

The switch sets the rate of the model's :class:`~vitlab.models.layers.PatchDropout` (``patch_drop.p``),
which every forward reads, so a resumed run picks it up again from its step.
"""

from __future__ import annotations

from torch import nn

from ..models.layers import PatchDropout
from .recipes import Recipe

__all__ = ["ends_dropping", "mean_step_cost", "rate_at", "set_rate", "switch_step"]


def ends_dropping(recipe: Recipe) -> bool:
    """Whether the recipe drops tokens and stops before the end (``token_drop_until`` < 1)."""
    return bool(recipe.token_drop) and recipe.token_drop_until < 1


def switch_step(recipe: Recipe, *, total_steps: int) -> int | None:
    """The first optimizer step (0-based) that trains on every token, or None when the recipe drops
    tokens throughout (or never)."""
    return round(recipe.token_drop_until * total_steps) if ends_dropping(recipe) else None


def rate_at(recipe: Recipe, *, step: int, total_steps: int) -> float:
    """The token-drop rate for optimizer step ``step`` (0-based) of ``total_steps``."""
    end = switch_step(recipe, total_steps=total_steps)
    return 0.0 if end is not None and step >= end else recipe.token_drop


def set_rate(model: nn.Module, rate: float) -> bool:
    """Set the token-drop rate of every :class:`PatchDropout` in ``model`` (a ViT, or a wrapper around one);
    True when one changed. A model built without token dropping has none to set (its rate stays 0)."""
    changed = False
    for layer in model.modules():
        if isinstance(layer, PatchDropout) and layer.p != rate:
            layer.p, changed = rate, True
    return changed


def mean_step_cost(recipe: Recipe, *, full_over_dropped: float) -> float:
    """The mean cost of the planned steps relative to a step that drops tokens, given the measured cost of a
    step on every token relative to one that drops (``full_over_dropped``): what ``--time-budget`` multiplies
    the timed (dropping) step by to plan the run's length."""
    if not ends_dropping(recipe):
        return 1.0
    return recipe.token_drop_until + (1 - recipe.token_drop_until) * full_over_dropped
