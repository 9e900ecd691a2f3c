"""A run's figures: ``curves.png`` (loss, accuracy and learning rate against epochs) and ``confusion.png``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .outputs import read_metrics

__all__ = ["MAX_CONFUSION_FIGURE", "draw_figures", "plot_confusion", "plot_curves"]


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


def plot_confusion(
    confusion: np.ndarray, class_names: Sequence[str], path: str | os.PathLike[str], *, where: str | None = None
) -> None:
    """Row-normalised confusion matrix (rows: true class, columns: predicted); ``where``: what it was measured on
    (the split, the epoch of the weights), in its title."""
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
    on = f" on {where}" if where else ""
    ax.set(xlabel="predicted", ylabel="true", title=f"confusion{on} (accuracy {np.trace(cm) / max(cm.sum(), 1):.1%})")
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MAX_CONFUSION_FIGURE = 100
"""Most classes a ``confusion.png`` is drawn for: beyond, a cell is under a pixel and no label is readable."""


def draw_figures(out: Path, class_names: Sequence[str], ev: dict[str, Any], *, title: str | None = None) -> None:
    """``curves.png`` from ``out/metrics.jsonl`` and ``confusion.png`` from the evaluation ``ev`` (for at most
    :data:`MAX_CONFUSION_FIGURE` classes; a note says so otherwise; ``title``: what ``ev`` was measured on); a
    failure is a warning, because a figure must never kill a training run."""
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
            plot_confusion(ev["confusion"], class_names, out / "confusion.png", where=title)
    except Exception as e:
        print(f"warning: could not draw figures ({type(e).__name__}: {e})", file=sys.stderr)
