"""A run's figures: ``curves.png`` (the training and evaluation loss, accuracy and learning rate against epochs),
``health.png`` (the attention health per layer against epochs, when the run watched it), ``confusion.png`` and
``reliability.png`` (the calibration of ``model/``'s weights). Each
is drawn to a temporary file and renamed over its entry (:func:`vitlab._fs.replacing`): a link named like a figure
is replaced, never written through."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..._fs import replacing
from ..._version import __version__
from .health import health_records
from .outputs import read_metrics

__all__ = [
    "FIGURE_EVERY_S",
    "MAX_CONFUSION_FIGURE",
    "draw_figures",
    "draw_run_figures",
    "plot_confusion",
    "plot_curves",
    "plot_health",
    "plot_reliability",
    "redraw_due",
]


def plot_curves(
    rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, num_classes: int | None = None
) -> None:
    """The training and evaluation loss, evaluation top-1/top-5 and learning rate against epochs; no top-5 with 5
    classes or fewer (it is 100% by construction). A loss that is not a number in a row (none measured) is left out
    of its curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [r["epoch"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for key, label in (("train_loss", "train"), ("eval_loss", "eval")):
        pts = [(r["epoch"], r[key]) for r in rows if _number(r.get(key))]
        if pts:
            axes[0].plot(*zip(*pts), marker=".", label=label)
    axes[0].set(title="loss", xlabel="epoch")
    if axes[0].get_lines():
        axes[0].legend()
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
    _save(fig, path)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))


def _save(fig: Any, path: str | os.PathLike[str]) -> None:
    """``fig`` as the PNG ``path`` (through a temporary file renamed over it; tagged as vitlab's), then closed."""
    import matplotlib.pyplot as plt

    try:
        with replacing(Path(path)) as tmp:
            fig.savefig(tmp, format="png", dpi=100, metadata={"Software": f"vitlab {__version__}"})
    finally:
        plt.close(fig)


_HEALTH_PANELS = (
    ("distance", "mean attention distance (px)", "uniform_distance", "uniform attention"),
    ("entropy", "attention entropy (nats)", "max_entropy", "uniform (log tokens)"),
    ("collapsed_fraction", "heads collapsed (entropy < threshold)", None, None),
    ("max_logit", "largest attention logit", None, None),
    ("outlier_ratio", "largest / median token norm", None, None),
)


def plot_health(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> bool:
    """``health.png``: each attention-health measure of the rows (:mod:`.health`) against epochs, one curve per
    layer (dark: the first layer, light: the last), with the uniform-attention scale where it has one. False
    (nothing drawn) when no row has a record."""
    recs = health_records(rows)
    if not recs:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    layers = max(len(r.get("distance") or []) for _, r in recs)
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(layers, 1)))
    fig, grid = plt.subplots(2, 3, figsize=(13, 7))
    axes = list(grid.flat)
    for ax, (key, title, scale, scale_name) in zip(axes, _HEALTH_PANELS):
        for i in range(layers):
            pts = [(ep, r[key][i]) for ep, r in recs if isinstance(r.get(key), list) and len(r[key]) > i]
            pts = [(ep, v) for ep, v in pts if isinstance(v, (int, float))]
            if pts:
                ax.plot(*zip(*pts), marker=".", color=colours[i], label=f"layer {i + 1}")
        ref = [r.get(scale) for _, r in recs] if scale else []
        if ref and isinstance(ref[-1], (int, float)):
            ax.axhline(ref[-1], color="grey", linestyle="--", linewidth=1, label=scale_name)
        if key == "collapsed_fraction":
            ax.set_ylim(-0.05, 1.05)
        ax.set(title=title, xlabel="epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if layers > 8:  # the first, the middle and the last layer name the colours
        keep = {0, layers // 2, layers - 1}
        handles = [h for j, h in enumerate(handles) if j not in range(layers) or j in keep]
        labels = [x for j, x in enumerate(labels) if j not in range(layers) or j in keep]
    axes[-1].axis("off")  # the sixth cell names the layers
    axes[-1].legend(handles, labels, loc="center", fontsize=8, title=f"{layers} layers")
    fig.tight_layout()
    _save(fig, path)
    return True


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
    title = f"confusion{on} (accuracy {np.trace(cm) / max(cm.sum(), 1):.1%})"
    ax.set(xlabel="predicted", ylabel="true")
    ax.set_title(_wrapped(title, width_in=size + 1, fontsize=11), fontsize=11)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    _save(fig, path)


def _wrapped(text: str, *, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines that fit a figure ``width_in`` inches wide at ``fontsize`` points (an average
    character is about 0.6 of the font size wide), so that a long title is never cut at the figure's edge."""
    chars = max(16, int(0.8 * width_in * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars, break_long_words=True, break_on_hyphens=False)) or text


def plot_reliability(calibration: dict[str, Any], path: str | os.PathLike[str], *, where: str | None = None) -> None:
    """``reliability.png``: a reliability diagram (Guo et al. 2017, Fig. 1) of a calibration record
    (:meth:`~vitlab.evaluate.calibration.Calibration.to_dict`): per confidence bin, the accuracy against the mean
    top-1 confidence of its images, with the temperature (calibrated) and without it, the diagonal where they would
    agree, and below, how many images each bin holds. ``where``: what it was measured on, in its title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = int(calibration["reliability"]["bins"])
    centres = (np.arange(bins) + 0.5) / bins
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(6, 6.6), height_ratios=[3, 1], sharex=True)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    t = calibration["temperature"]
    for key, label, marker in (
        ("reliability_uncalibrated", f"uncalibrated (ECE {_pct(calibration.get('ece_uncalibrated'))})", "s"),
        ("reliability", f"T = {t:.3g} (ECE {_pct(calibration.get('ece'))})", "o"),
    ):
        r = calibration[key]
        pts = [(c, a) for c, a in zip(r["confidence"], r["accuracy"]) if c is not None and a is not None]
        if pts:
            ax.plot(*zip(*pts), marker=marker, label=label)
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    n = calibration.get("ece_images", 0)
    on = f" on {where}" if where else ""
    ax.set_title(_wrapped(f"reliability{on}: {n:,} images that did not fit T", width_in=6, fontsize=10), fontsize=10)
    width = 1 / bins
    hist.bar(centres - width / 4, calibration["reliability_uncalibrated"]["count"], width=width / 2, label="uncal.")
    hist.bar(centres + width / 4, calibration["reliability"]["count"], width=width / 2, label="T")
    hist.set(xlabel=f"top-1 confidence ({bins} bins)", ylabel="images")
    hist.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}%" if _number(v) else "-"


MAX_CONFUSION_FIGURE = 100
"""Most classes a ``confusion.png`` is drawn for: beyond, a cell is under a pixel and no label is readable."""


def draw_figures(out: Path, class_names: Sequence[str], ev: dict[str, Any], *, title: str | None = None) -> None:
    """``curves.png`` and ``health.png`` from ``out/metrics.jsonl``, ``reliability.png`` from ``ev``'s calibration
    (where it has one) and ``confusion.png`` from the evaluation ``ev`` (for at most :data:`MAX_CONFUSION_FIGURE`
    classes; a note says so otherwise; ``title``: what ``ev`` was measured on); a failure is a warning, because a
    figure must never kill a training run."""
    try:
        classes = len(class_names) if "per_class" in ev else None  # MPP's top-5 is over 512 colours
        rows = read_metrics(out / "metrics.jsonl")
        plot_curves(rows, out / "curves.png", num_classes=classes)
        plot_health(rows, out / "health.png")
        if classes is not None and classes > MAX_CONFUSION_FIGURE:
            print(
                f"note: no confusion.png: {classes:,} classes are too many to read in one figure (it is drawn for "
                f"up to {MAX_CONFUSION_FIGURE}); vitlab eval writes per-class accuracy",
                file=sys.stderr,
            )
        elif "confusion" in ev:  # not for MPP's 512 colours
            plot_confusion(ev["confusion"], class_names, out / "confusion.png", where=title)
        if isinstance(ev.get("calibration"), dict):
            plot_reliability(ev["calibration"], out / "reliability.png", where=title)
    except Exception as e:
        print(f"warning: could not draw figures ({type(e).__name__}: {e})", file=sys.stderr)


FIGURE_EVERY_S = 30.0
"""A run's figures are redrawn at the first epoch end this many seconds after the last drawing."""


def redraw_due(*, since_last: float, left: float | None) -> bool:
    """Whether a run redraws its figures at an epoch's end, ``since_last`` seconds after it last drew them: every
    :data:`FIGURE_EVERY_S` seconds, but not in a time budget's last :data:`FIGURE_EVERY_S` (``left``: the budget's
    seconds left; None without one). The end of the run draws them; a redraw just before, seconds with
    matplotlib's start, would be steps lost (a 1-minute run spent 2.5 to 3.7 s of its budget on one)."""
    return since_last > FIGURE_EVERY_S and (left is None or left > FIGURE_EVERY_S)


def draw_run_figures(
    out: Path, class_names: Sequence[str], val_name: str, *, model_eval: dict[str, Any] | None,
    last_eval: dict[str, Any] | None,
) -> None:  # fmt: skip
    """A run's figures: ``curves.png``, and ``confusion.png`` of the weights ``model/`` holds (``model_eval``, their
    evaluation by this process); a resumed run whose ``model/`` is older (``model_eval`` None) draws the curves from
    ``last_eval`` only and leaves ``confusion.png`` as the process that saved the weights drew it."""
    ev = model_eval
    if ev is None and last_eval is not None:
        ev = {k: v for k, v in last_eval.items() if k != "confusion"}  # the curves only
    if ev is not None:
        where = f"{val_name}, model/ = epoch {ev['epoch']}" if "epoch" in ev else val_name
        draw_figures(out, class_names, ev, title=where)
