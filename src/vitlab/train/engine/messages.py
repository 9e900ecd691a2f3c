"""What a run prints: the line it starts with, one line per epoch, what fine-tuning started from, the expected wall
time from its first steps, and the line of a run stopped early."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ..._text import shell_word, size_px
from ..._units import counted, duration
from ..sizing.pace import step_forwards

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from ...data.sources import DataSplits
    from ...models import VisionTransformer
    from ..conf.recipes import Recipe
    from ..persist.position import RunPosition
    from ..sizing.steps import RunPlan

__all__ = ["WallEstimate", "before_line", "epoch_line", "init_line", "start_line", "stopped_line"]


def epoch_line(row: dict[str, Any], *, epochs: int, num_classes: int) -> str:
    """The plain line each epoch prints (a log file, a scheduler or ``tee`` reads one per epoch):
    ``epoch 3/10 step 120: loss 0.512, top-1 91.20%, ...``. Top-5 only with more than 5 classes
    (otherwise it is 100% by construction); a packed run's native-aspect top-1 and padding after it."""
    top5 = f", top-5 {100 * row['top5']:.2f}%" if num_classes > 5 and row.get("top5") is not None else ""
    packed = (
        f", native aspect top-1 {100 * row['top1_native']:.2f}%, padding {100 * row['padding']:.1f}%"
        if "top1_native" in row
        else ""
    )
    return (
        f"epoch {row['epoch']}/{epochs} step {row['step']}: train loss {_train_loss(row)}, "
        f"eval loss {row['eval_loss']:.4f}, top-1 {100 * row['top1']:.2f}%{top5}{packed}, lr {row['lr']:.2e}, "
        f"{row['images_per_sec']:.0f} img/s, {row['wall_s']:.1f} s"
    )


def _train_loss(row: dict[str, Any]) -> str:
    """The epoch's training loss of the steps taken, and how many were skipped for a NaN/Inf loss."""
    skipped = f" ({row['nan_skipped']} step(s) skipped: NaN/Inf loss)" if row.get("nan_skipped") else ""
    if row.get("train_loss") is None:
        return f"none{skipped or ' (no step taken)'}"
    return f"{row['train_loss']:.4f}{skipped}"


def init_line(init: str, old: Any, new: Any, *, new_head: bool, why: str) -> str:
    """What fine-tuning started from (Sec. 3.2): the model, whether the position embeddings were
    resampled to the new patch grid, and whether the head was kept or replaced by a zero one (``why``:
    :func:`~vitlab.train.conf.arch.head_choice`'s reason)."""

    def grid(c: Any) -> str:
        return "x".join(str(s // p) for s, p in zip(c.img_size, (c.patch_size, c.patch_size)))

    pos = (
        f"position embeddings resampled {grid(old)} -> {grid(new)} (2-D interpolation)"
        if grid(old) != grid(new)
        else f"position embeddings kept ({grid(new)} patches)"
    )
    if new.posemb not in ("learn", "learn2d"):  # nothing learned to resample (DINOv3's RoPE, a fixed table)
        pos = f"no learned position table ({'2-D RoPE' if new.rope else new.posemb} on the {grid(new)} grid)"
    head = (
        f"head replaced by a zero-initialised one for {new.num_classes} classes ({why})"
        if new_head
        else f"head kept: {why} (--new-head for a new one)"
    )
    px = "x".join(map(str, old.img_size))
    return f"fine-tuning from {init} ({old.name}, {old.num_classes} classes, {px} px): {pos}; {head}"


def start_line(
    model: VisionTransformer,
    data: DataSplits,
    recipe: Recipe,
    plan: RunPlan,
    processes: int,
    device: torch.device,
    *,
    time_budget: float | None = None,
) -> str:
    """The line a run starts with: what is trained on what, with which recipe and plan (its peak LR; a plan saved
    before plans kept one: the recipe's, scaled to its batch), where; with ``--time-budget`` the wall time it was
    planned to take (otherwise :class:`WallEstimate` times the first steps)."""
    m = model.config
    lr = plan.lr or recipe.scaled_lr(recipe.batch_size)
    wall = f"; expected wall time ~{duration(time_budget)} (--time-budget)" if time_budget else ""
    return (
        f"training {m.name} ({model.num_params():,} params, {size_px(m.img_size)}, "
        f"patch {m.patch_size}) on {data.name}: {len(data.train):,} train / {len(data.val):,} {data.val_name} "
        f"images, {data.num_classes} classes; recipe {recipe.name}, {counted(plan.epochs, 'epoch')} = "
        f"{counted(plan.total_steps, 'step')} of {recipe.batch_size}, lr {lr:.2g}, "
        f"{processes} process(es) on {device.type}"
        + (f"; token drop {recipe.token_drop:g} in training" if recipe.token_drop else "")
        + (f" for the first {recipe.token_drop_until:.0%} of the steps" if recipe.token_drop_until < 1 else "")
        + f"; inputs normalised by mean {_triple(m.mean)}, std {_triple(m.std)}"
        + (
            "; resolution " + ", ".join(f"{s} px to {e:.0%}" for s, e in recipe.res_schedule) + " of the steps"
            if recipe.res_schedule
            else ""
        )
        + wall
    )


def before_line(ev: dict[str, Any], *, size: tuple[int, int], split: str) -> str:
    """The started-from model's accuracy ``ev`` on the evaluation split at the new size, before any step."""
    h, w = size
    return f"before fine-tuning, at {h}x{w}: top-1 {100 * ev['top1']:.2f}% on {split}"


def stopped_line(p: RunPosition, *, by: str | None, saved: Path, out: Path) -> str:
    """The last line of a run stopped before its plan's end (``by``: the signal that stopped it): where it is
    saved and how to go on."""
    how = f" by {by}" if by else ""
    return (
        f"stopped{how} at epoch {p.epoch + 1}, step {p.step}; saved {saved}. "
        f"Continue with: vitlab train --out {shell_word(out)} --resume"
    )


def _triple(values: tuple[float, ...]) -> str:
    """``0.491/0.482/0.447``; one value when all are equal."""
    return f"{values[0]:.3g}" if len(set(values)) == 1 else "/".join(f"{v:.3g}" for v in values)


class WallEstimate:
    """The expected wall time of a run without ``--time-budget``, from a quick timing of its own first
    optimizer steps (data loading and augmentation included): steps 1 to ``1 + k`` of this process, ``k``
    a tenth of the steps left, 1 to 10. Each evaluation is counted as a forward pass over the evaluation
    split, a training step's cost per image over its forwards (a third when every weight trains, the whole of it
    when the head alone does: :func:`~vitlab.train.sizing.pace.step_forwards`)."""

    def __init__(
        self, *, total_steps: int, steps_per_epoch: int, batch_size: int, n_eval: int, tuning: str = "full"
    ) -> None:
        self.total, self.spe, self.batch, self.n_eval = total_steps, max(1, steps_per_epoch), batch_size, n_eval
        self.forwards = step_forwards(tuning)
        self.t0 = 0.0
        self.until: int | None = None

    def after_step(self, *, steps_this_run: int, step: int, wall_s: float) -> str | None:
        """Called after every optimizer step (``step``: of the run, ``wall_s``: the run's wall seconds so far);
        the line to print once the timing window is over, else None."""
        if steps_this_run == 1:
            left = self.total - step
            self.until = 1 + min(10, left // 10) if left >= 4 else None
            self.t0 = time.perf_counter()
            return None
        if self.until is None or steps_this_run != self.until:
            return None
        per_step = (time.perf_counter() - self.t0) / (self.until - 1)
        left = self.total - step
        evals = math.ceil(self.total / self.spe) - step // self.spe
        eval_s = per_step / self.forwards * self.n_eval / max(1, self.batch)
        total_s = wall_s + left * per_step + evals * eval_s
        timed = f"step {step}" if self.until == 2 else f"steps {step - self.until + 2}-{step}"  # (not "32-32")
        return (
            f"expected wall time ~{duration(total_s)} ({per_step * 1000:.0f} ms per step over {timed}, {left} steps "
            f"and {evals} evaluation(s) to go)"
        )
