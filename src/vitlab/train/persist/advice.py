"""The one line of advice at the end of a finished run (issue 18): what its per-epoch curves say about the
run's length and its regularisation, and the flag to change. Rules, not a model: each fires on a documented
threshold and names the flags a timm user would reach for."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..sizing.levels import regularisers
from .health import with_alarms

if TYPE_CHECKING:
    from ..conf.recipes import Recipe

__all__ = ["NOISE_SE", "OVERFIT_RATIO", "RISE_POINTS", "UNDERFIT_RATIO", "advice_line", "top1_stderr"]

NOISE_SE = 2.0
"""A change is told from noise when it exceeds this many standard errors of what it is measured on: the evaluation
split's size decides whether a rise of top-1 or of the loss means anything (6 images: nothing)."""


def top1_stderr(top1: float, n: int) -> float:
    """The standard error of a top-1 accuracy ``top1`` (0-1) measured on ``n`` images, in percentage points: the
    binomial ``sqrt(p (1 - p) / n)``, with ``p`` taken as ``(k + 1) / (n + 2)`` for ``k`` right answers (Laplace's
    rule), so that 0% or 100% on a few images is not read as exact."""
    k = round(top1 * n)
    p = (k + 1) / (n + 2)
    return 100 * math.sqrt(p * (1 - p) / max(n, 1))


RISE_POINTS = 3.0
"""Top-1 is "still rising steeply" when the last 20% of the epochs (at least one) gained more than this many
percentage points: a longer run would very likely end higher."""
UNDERFIT_RATIO, UNDERFIT_MARGIN = 1.25, 0.1
"""Train loss is "far above" the evaluation loss when ``train > UNDERFIT_RATIO * eval + UNDERFIT_MARGIN``: more
than label smoothing 0.1 alone adds, so the training-time augmentation and regularisation (MixUp/CutMix,
RandAugment, random erasing, stochastic depth) make the task much harder than the test: underfitting."""
OVERFIT_RATIO = 1.15
"""The run overfits when its last evaluation loss is more than this times the lowest of the run while the train
loss has kept falling since that epoch: the model memorises the training images (the mild level and MixUp of
``docs/training.md`` were measured against exactly this)."""


def _stronger(recipe: Recipe) -> list[str]:
    """The two mildest additions against memorising, for a recipe that has neither: a random crop, MixUp."""
    off = (("--crop-scale 0.8,1", recipe.crop_scale[0] >= 1.0), ("--mixup 0.2", recipe.mixup == 0))
    return [flag for flag, yes in off if yes]


def advice_line(
    rows: Sequence[dict[str, Any]],
    *,
    recipe: Recipe,
    epochs: int,
    time_budget: float | None = None,
    n_eval: int | None = None,
    alarms: Sequence[str] = (),
    notes: Sequence[str] = (),
    method: tuple[str, str] | None = None,
    given: Collection[str] = (),
) -> str | None:
    """One line of advice at the end of a finished run, or None. Three findings, each with its fix:

    - top-1 still rising steeply (:data:`RISE_POINTS`, and :data:`NOISE_SE` standard errors of the last top-1 on the
      ``n_eval`` evaluation images, :func:`top1_stderr`): train longer (``--epochs`` or ``--time-budget`` doubled);
    - train loss far above the evaluation loss (:data:`UNDERFIT_RATIO`) while the recipe regularises beyond what the
      ``auto`` rule chose (:func:`~vitlab.train.sizing.levels.regularisers`: a named recipe's regularisers, or those
      the user set, ``given``): the flags that lighten it (a named recipe other than ``auto`` also gets ``--recipe
      auto``, fitted to the run's length);
    - evaluation loss risen from its lowest while the train loss fell (:data:`OVERFIT_RATIO`, and by more than
      :data:`NOISE_SE` standard errors of a mean loss over ``n_eval`` images, taken as ``loss / sqrt(n_eval)``: one
      image's cross-entropy spreads about as much as its mean): a random crop and MixUp where the recipe has none,
      else as many epochs (or that share of the budget) as reached the lowest loss.

    A fine-tune's ``method`` finding (:func:`~vitlab.train.sizing.finetune.method_advice`: the method given is not
    the one the fine-tune rule picks, and its flag) comes first, whatever the curves say.

    Needs three epochs or more (``rows``: ``metrics.jsonl``'s); ``n_eval`` None: no noise test. The
    attention-health ``alarms`` (issue 39) follow, one ``advice:`` line each, then its ``notes``, one ``note:`` line
    each (:func:`.health.with_alarms`)."""
    why, fix = ([method[0]], [method[1]]) if method is not None else ([], [])
    if len(rows) < 3 or any(r.get(k) is None for r in rows for k in ("top1", "eval_loss", "train_loss")):
        return with_alarms(f"advice: {why[0]}: try {fix[0]}" if why else None, alarms, notes)
    k = max(1, round(0.2 * len(rows)))
    gain = 100 * (rows[-1]["top1"] - rows[-1 - k]["top1"])
    noise = NOISE_SE * top1_stderr(rows[-1]["top1"], n_eval) if n_eval else 0.0
    if gain > RISE_POINTS and (not noise or gain > noise):
        of = f"the last {k} of {len(rows)} epochs" if k > 1 else f"the last of {len(rows)} epochs"
        beyond = f", beyond the noise of {n_eval:,} evaluation images" if n_eval and noise > RISE_POINTS else ""
        why.append(f"top-1 still rising steeply (+{gain:.1f} points over {of}{beyond})")
        fix.append(f"--time-budget {2 * time_budget / 60:g}m" if time_budget else f"--epochs {2 * epochs}")
    train, ev = rows[-1]["train_loss"], rows[-1]["eval_loss"]
    lighter = regularisers(recipe, given=given)
    if lighter and train > UNDERFIT_RATIO * ev + UNDERFIT_MARGIN:
        why.append(f"train loss {train:.2f} far above eval loss {ev:.2f} (underfitting: too much regularisation)")
        fix.append(("--recipe auto, or " if recipe.name != "auto" else "") + " ".join(lighter))
    low = min(range(len(rows)), key=lambda i: rows[i]["eval_loss"])
    loss_noise = NOISE_SE * ev / math.sqrt(n_eval) if n_eval else 0.0
    risen = ev > OVERFIT_RATIO * rows[low]["eval_loss"] and ev - rows[low]["eval_loss"] > loss_noise
    if risen and train < rows[low]["train_loss"]:
        best = rows[low].get("epoch", low + 1)
        why.append(
            f"eval loss up from {rows[low]['eval_loss']:.2f} (epoch {best}) to {ev:.2f} while train loss fell "
            f"to {train:.2f} (overfitting)"
        )
        shorter = f"--time-budget {time_budget * (low + 1) / len(rows) / 60:.3g}m" if time_budget else ""
        fix.append(" ".join(_stronger(recipe)) or shorter or f"--epochs {best}")
    return with_alarms(f"advice: {' and '.join(why)}: try {' and '.join(fix)}" if why else None, alarms, notes)
