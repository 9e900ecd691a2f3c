"""Run outputs: ``metrics.jsonl`` (one line per epoch), ``summary.json``, ``curves.png``, ``confusion.png``
and ``model/`` (the vitlab folder of the best or last weights)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._fs import atomic_write_text

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..data.sources import DataSplits
    from ..models import VisionTransformer, ViTConfig
    from .checkpointing import Progress
    from .config import TrainConfig
    from .recipes import Recipe

__all__ = [
    "MAX_CONFUSION_FIGURE",
    "WallEstimate",
    "append_metrics",
    "draw_figures",
    "model_summary",
    "plot_confusion",
    "plot_curves",
    "read_metrics",
    "run_summary",
    "save_run_model",
    "start_line",
    "truncate_metrics",
    "write_json",
]


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Atomic JSON write."""
    p = Path(path)
    atomic_write_text(p, json.dumps(obj, indent=2) + "\n")


def append_metrics(row: dict[str, Any], path: str | os.PathLike[str]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by a kill
            break
    return rows


def truncate_metrics(path: str | os.PathLike[str], *, last_epoch: int) -> list[dict[str, Any]]:
    """Keep the rows of epochs ``<= last_epoch`` (those the resume checkpoint has seen)."""
    rows = [r for r in read_metrics(path) if r.get("epoch", 0) <= last_epoch]
    p = Path(path)
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def plot_curves(
    rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, num_classes: int | None = None
) -> None:
    """Training loss, test top-1/top-5 and learning rate against epochs; no top-5 with 5 classes or
    fewer (it is 100% by construction)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [r["epoch"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot(ep, [r["train_loss"] for r in rows], marker=".")
    axes[0].set(title="train loss", xlabel="epoch")
    axes[1].plot(ep, [100 * r["top1"] for r in rows], marker=".", label="top-1")
    if num_classes is None or num_classes > 5:
        axes[1].plot(ep, [100 * r["top5"] for r in rows], marker=".", label="top-5")
    axes[1].set(title="eval accuracy (%)", xlabel="epoch")
    axes[1].legend()
    axes[2].plot(ep, [r["lr"] for r in rows], marker=".")
    axes[2].set(title="learning rate (end of epoch)", xlabel="epoch")
    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_confusion(confusion: np.ndarray, class_names: Sequence[str], path: str | os.PathLike[str]) -> None:
    """Row-normalised confusion matrix (rows: true class, columns: predicted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cm = np.asarray(confusion, dtype=np.float64)
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    n = len(class_names)
    size = min(12, 2 + 0.45 * n)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        ax.set_xticks(range(n), class_names, rotation=90 if n > 10 else 45, ha="right" if n <= 10 else "center")
        ax.set_yticks(range(n), class_names)
        if n <= 15:
            for i in range(n):
                for j in range(n):
                    ax.text(
                        j,
                        i,
                        f"{int(cm[i, j])}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if norm[i, j] > 0.5 else "black",
                    )
    ax.set(xlabel="predicted", ylabel="true", title=f"confusion (accuracy {np.trace(cm) / max(cm.sum(), 1):.1%})")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MAX_CONFUSION_FIGURE = 100
"""Most classes a ``confusion.png`` is drawn for: beyond, a cell is under a pixel and no label is readable."""


def draw_figures(out: Path, class_names: Sequence[str], ev: dict[str, Any]) -> None:
    """``curves.png`` from ``out/metrics.jsonl`` and ``confusion.png`` from the evaluation ``ev`` (for at most
    :data:`MAX_CONFUSION_FIGURE` classes; a note says so otherwise); a failure is a warning, because a
    figure must never kill a training run."""
    try:
        classes = len(class_names) if "per_class" in ev else None  # MPP's top-5 is over 512 colours
        plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png", num_classes=classes)
        if classes is not None and classes > MAX_CONFUSION_FIGURE:
            print(
                f"note: no confusion.png: {classes:,} classes are too many to read in one figure (it is drawn for "
                f"up to {MAX_CONFUSION_FIGURE}); vitlab eval writes per-class accuracy",
                file=sys.stderr,
            )
        elif "confusion" in ev:  # not for MPP's 512 colours
            plot_confusion(ev["confusion"], class_names, out / "confusion.png")
    except Exception as e:
        print(f"warning: could not draw figures ({type(e).__name__}: {e})", file=sys.stderr)


def save_run_model(model: nn.Module, path: Path, *, cfg: TrainConfig, ev: dict[str, Any], epoch: int) -> None:
    """Save ``model`` as a vitlab folder with what produced it: recipe, data, epoch, accuracy, ``--init``.
    It replaces the run's own earlier ``model/`` (the run folder was checked when the run started)."""
    from ..checkpoints import save

    r = cfg.recipe
    save(
        model,
        path,
        overwrite=True,
        extra={
            "crop_pct": r.crop_pct,
            "recipe": r.name,
            "data": cfg.data,
            "epoch": epoch,
            "top1": ev["top1"],
            "top5": ev["top5"],
            "init": cfg.init,
            "objective": cfg.objective,
        },
    )


def model_summary(mcfg: ViTConfig, init: str | None) -> dict[str, Any]:
    """The trained architecture as ``summary.json`` describes it."""
    return {
        "name": mcfg.name,
        "img_size": list(mcfg.img_size),
        "patch_size": mcfg.patch_size,
        "embed_dim": mcfg.embed_dim,
        "depth": mcfg.depth,
        "num_heads": mcfg.num_heads,
        "mlp_dim": mcfg.mlp_dim,
        "init": init,
    }


def run_summary(
    *,
    progress: Progress,
    plan: dict[str, Any],
    cfg: TrainConfig,
    model: VisionTransformer,
    data: DataSplits,
    processes: int,
    device: torch.device,
    out: Path,
    wall_s: float,
    rows: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """``summary.json``: the last epoch's accuracy (from the ``metrics.jsonl`` ``rows``), the best one,
    how far the run got against its plan, its throughput, the model, the data and the recipe."""
    p = progress
    return {
        "top1": rows[-1]["top1"] if rows else None,
        "top5": rows[-1]["top5"] if rows else None,
        "best_top1": p.best if p.best >= 0 else None,
        "epochs": p.epoch,
        "steps": p.step,
        "images_per_sec": p.images / max(p.train_s, 1e-9),
        "wall_s": wall_s,
        "params": model.num_params(),
        "model": model_summary(model.config, cfg.init),
        "data": data.describe(),
        "recipe": cfg.recipe.name,
        "recipe_config": cfg.recipe.to_dict(),
        "recipe_chosen": cfg.resolved,
        "objective": cfg.objective,
        "processes": processes,
        "device": device.type,
        "out": str(out),
        "interrupted": p.interrupted,
        "nan_skipped": p.nan_skipped,
        "planned_epochs": plan["epochs"],
        "planned_steps": plan["total_steps"],
    }


def epoch_line(row: dict[str, Any], *, epochs: int, num_classes: int) -> str:
    """The plain line each epoch prints (a log file, a scheduler or ``tee`` reads one per epoch):
    ``epoch 3/10 step 120: loss 0.512, top-1 91.20%, ...``. Top-5 only with more than 5 classes
    (otherwise it is 100% by construction)."""
    top5 = f", top-5 {100 * row['top5']:.2f}%" if num_classes > 5 and row.get("top5") is not None else ""
    return (
        f"epoch {row['epoch']}/{epochs} step {row['step']}: train loss {row['train_loss']:.4f}, "
        f"eval loss {row['eval_loss']:.4f}, top-1 {100 * row['top1']:.2f}%{top5}, lr {row['lr']:.2e}, "
        f"{row['images_per_sec']:.0f} img/s, {row['wall_s']:.1f} s"
    )


def init_line(init: str, old: Any, new: Any, *, new_head: bool) -> str:
    """What fine-tuning started from (Sec. 3.2): the model, whether the position embeddings were
    resampled to the new patch grid, and whether the head was kept or replaced by a zero one."""

    def grid(c: Any) -> str:
        return "x".join(str(s // p) for s, p in zip(c.img_size, (c.patch_size, c.patch_size)))

    pos = (
        f"position embeddings resampled {grid(old)} -> {grid(new)} (2-D interpolation)"
        if grid(old) != grid(new)
        else f"position embeddings kept ({grid(new)} patches)"
    )
    why = "other classes" if old.num_classes != new.num_classes else "the pre-training MLP head dropped"
    head = (
        f"head replaced by a zero-initialised one for {new.num_classes} classes ({why})"
        if new_head
        else f"head kept ({new.num_classes} classes)"
    )
    px = "x".join(map(str, old.img_size))
    return f"fine-tuning from {init} ({old.name}, {old.num_classes} classes, {px} px): {pos}; {head}"


def start_line(
    model: VisionTransformer,
    data: DataSplits,
    recipe: Recipe,
    plan: dict[str, Any],
    lr: float,
    processes: int,
    device: torch.device,
    *,
    time_budget: float | None = None,
) -> str:
    """The line a run starts with: what is trained on what, with which recipe and plan, where; with
    ``--time-budget`` the wall time it was planned to take (otherwise :class:`WallEstimate` times the first steps)."""
    m = model.config
    wall = f"; expected wall time ~{_duration(time_budget)} (--time-budget)" if time_budget else ""
    return (
        f"training {m.name} ({model.num_params():,} params, {m.img_size[0]}x{m.img_size[1]} px, "
        f"patch {m.patch_size}) on {data.name}: {len(data.train):,} train / {len(data.val):,} {data.val_name} "
        f"images, {data.num_classes} classes; recipe {recipe.name}, {plan['epochs']} epochs = "
        f"{plan['total_steps']} steps of {recipe.batch_size}, lr {lr:.2g}, {processes} process(es) on {device.type}"
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


def _triple(values: tuple[float, ...]) -> str:
    """``0.491/0.482/0.447``; one value when all are equal."""
    return f"{values[0]:.3g}" if len(set(values)) == 1 else "/".join(f"{v:.3g}" for v in values)


def _duration(seconds: float) -> str:
    """``45 s``, ``3.2 min``, ``1.5 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class WallEstimate:
    """The expected wall time of a run without ``--time-budget``, from a quick timing of its own first
    optimizer steps (data loading and augmentation included): steps 1 to ``1 + k`` of this process, ``k``
    a tenth of the steps left, 1 to 10. Each evaluation is counted as a forward pass over the evaluation
    split at a third of a training step's cost per image (no backward pass, no optimizer)."""

    def __init__(self, *, total_steps: int, steps_per_epoch: int, batch_size: int, n_eval: int) -> None:
        self.total, self.spe, self.batch, self.n_eval = total_steps, max(1, steps_per_epoch), batch_size, n_eval
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
        eval_s = per_step / 3 * self.n_eval / max(1, self.batch)
        total_s = wall_s + left * per_step + evals * eval_s
        return (
            f"expected wall time ~{_duration(total_s)} ({per_step * 1000:.0f} ms per step over steps "
            f"{step - self.until + 2}-{step}, {left} steps and {evals} evaluation(s) to go)"
        )
