"""Matplotlib renderings of Fig. 6 and Fig. 7 (headless: the Agg backend, no display needed).

Every ``plot_*`` function takes plain tensors (from :mod:`vitlab.inspect.attention`
and :mod:`vitlab.inspect.embeddings`) and returns a ``matplotlib.figure.Figure``;
:func:`png_bytes` and :func:`save_png` turn it into a file.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: never open a window, work without a display

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from .._fs import atomic_write_bytes

__all__ = [
    "plot_attention_distance",
    "plot_filter_pcs",
    "plot_layer_attention",
    "plot_posemb_similarity",
    "plot_rollout",
    "png_bytes",
    "rollout_masks",
    "save_png",
]


def png_bytes(fig: Figure, *, dpi: int = 100) -> bytes:
    """Render ``fig`` to PNG bytes and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def save_png(fig: Figure, path: str | os.PathLike[str], *, dpi: int = 100) -> bytes:
    """Write ``fig`` as a PNG file, close it, and return the bytes (for embedding)."""
    data = png_bytes(fig, dpi=dpi)
    atomic_write_bytes(Path(path), data)  # (a link at path is replaced, never written through)
    return data


def _to_unit(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.full_like(x, 0.5)


def plot_filter_pcs(components: torch.Tensor, explained: torch.Tensor | None = None, *, ncols: int = 7) -> Figure:
    """Fig. 7 left: each principal component ``(C, P, P)`` as a tile, RGB for C = 3,
    grey for C = 1 (other C: the mean over channels), each scaled to [0, 1] on its own."""
    k = components.shape[0]
    ncols = max(1, min(ncols, k))
    nrows = max(1, -(-k // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(1.2 * ncols, 1.3 * nrows + 0.4), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i >= k:
            continue
        c = components[i].numpy()
        if c.shape[0] == 3:
            ax.imshow(_to_unit(c.transpose(1, 2, 0)), interpolation="nearest")
        else:
            ax.imshow(_to_unit(c.mean(axis=0)), cmap="gray", interpolation="nearest")
        if explained is not None:
            ax.set_title(f"{100 * float(explained[i]):.1f}%", fontsize=7)
    kind = "RGB embedding filters" if components.shape[1] == 3 else "Embedding filters"
    fig.suptitle(f"{kind} (first {k} principal components)", fontsize=10)
    return fig


def plot_posemb_similarity(sim: torch.Tensor) -> Figure:
    """Fig. 7 centre: a grid of small heatmaps; tile (r, c) is the cosine similarity between
    the position embedding of the patch at row r, column c and every other patch.

    Drawn as one mosaic image (with blank separators) so large grids stay fast.
    """
    gh, gw = sim.shape[:2]
    pad = 1
    mosaic = np.full((gh * (gh + pad) - pad, gw * (gw + pad) - pad), np.nan)
    s = sim.numpy()
    for r in range(gh):
        for c in range(gw):
            y, x = r * (gh + pad), c * (gw + pad)
            mosaic[y : y + gh, x : x + gw] = s[r, c]
    size = min(10.0, 1.0 + 0.45 * max(gh, gw))
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    im = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([c * (gw + pad) + (gw - 1) / 2 for c in range(gw)], [str(c + 1) for c in range(gw)], fontsize=7)
    ax.set_yticks([r * (gh + pad) + (gh - 1) / 2 for r in range(gh)], [str(r + 1) for r in range(gh)], fontsize=7)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="Cosine similarity")
    ax.set_title("Position embedding similarity", fontsize=10)
    return fig


def plot_attention_distance(dist: torch.Tensor, *, img_size: tuple[int, int] | None = None) -> Figure:
    """Fig. 7 right: mean attention distance (pixels) of each head (colour) against network depth (layer)."""
    layers, heads = dist.shape
    fig, ax = plt.subplots(figsize=(5, 4))
    cmap = plt.get_cmap("tab20" if heads > 10 else "tab10")
    x = np.arange(1, layers + 1)
    for h in range(heads):
        ax.scatter(x, dist[:, h].numpy(), s=14, color=cmap(h % cmap.N), label=f"Head {h + 1}")
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    if img_size is not None:
        ax.set_ylim(0, float(np.hypot(*img_size)) / 2 + 1)
    ax.set_xticks(x)
    ax.grid(alpha=0.3)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2 if heads > 8 else 1, loc="lower right")
    ax.set_title("Mean attention distance per head", fontsize=10)
    return fig


def _upsample(maps: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """``(B, gh, gw)`` -> ``(B, H, W)`` bilinear."""
    return (
        F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]
        .clamp(0, None)
        .numpy()
    )


def _show(ax, img: np.ndarray) -> None:
    ax.imshow(img if img.shape[-1] == 3 else img[..., 0], cmap=None if img.shape[-1] == 3 else "gray", vmin=0, vmax=1)
    ax.axis("off")


def rollout_masks(maps: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """Rollout maps ``(B, gh, gw)`` upsampled to ``size`` and scaled to [0, 1] by each map's own minimum
    and maximum. With the residual term the rollout is close to uniform (every patch reaches the
    output token), so a mask scaled by its maximum alone leaves the image almost unchanged; the
    min-max scaling shows which patches reach it most, as the paper's Fig. 6 does."""
    up = _upsample(maps, size)
    lo = up.reshape(len(up), -1).min(axis=1)[:, None, None]
    hi = up.reshape(len(up), -1).max(axis=1)[:, None, None]
    return (up - lo) / np.maximum(hi - lo, 1e-12)


ROLLOUT_CMAP = "inferno"
"""A perceptually uniform colour map (lightness grows with the value), readable in grey too; not jet."""


def plot_rollout(images: torch.Tensor, maps: torch.Tensor, *, titles: list[str] | None = None) -> Figure:
    """Fig. 6: each image, the image multiplied by its normalised rollout mask (as in the paper), and
    the mask as a heatmap (perceptual colour map, :data:`ROLLOUT_CMAP`) with a colour bar.
    ``images``: ``(B, H, W, C)`` in [0, 1]; ``maps``: ``(B, gh, gw)``."""
    b, h, w, _ = images.shape
    masks = rollout_masks(maps, (h, w))
    fig, axes = plt.subplots(b, 3, figsize=(9, 3 * b), squeeze=False, layout="constrained")
    imgs = images.numpy()
    heat = None
    for i in range(b):
        _show(axes[i, 0], imgs[i])
        _show(axes[i, 1], imgs[i] * masks[i][..., None])
        heat = axes[i, 2].imshow(masks[i], cmap=ROLLOUT_CMAP, vmin=0, vmax=1)
        axes[i, 2].axis("off")
        axes[i, 0].set_title(titles[i] if titles else "Input", fontsize=11)
        axes[i, 1].set_title("Input x rollout mask", fontsize=11)
        axes[i, 2].set_title("Rollout (normalised)", fontsize=11)
    bar = fig.colorbar(heat, ax=axes[:, 2], shrink=0.8, label="rollout, scaled to [0, 1] per image")
    bar.ax.tick_params(labelsize=10)
    return fig


def plot_layer_attention(images: torch.Tensor, maps: torch.Tensor) -> Figure:
    """The raw (head-averaged) attention of the output token at every layer, one row per image.
    ``maps``: ``(layers, B, gh, gw)``; each map is shown on its own colour scale."""
    layers, b = maps.shape[:2]
    h, w = images.shape[1:3]
    fig, axes = plt.subplots(b, layers + 1, figsize=(1.3 * (layers + 1), 1.4 * b + 0.3), squeeze=False)
    imgs = images.numpy()
    for i in range(b):
        _show(axes[i, 0], imgs[i])
        up = _upsample(maps[:, i], (h, w))
        for layer in range(layers):
            ax = axes[i, layer + 1]
            ax.imshow(up[layer], cmap="inferno")
            ax.axis("off")
            if i == 0:
                ax.set_title(f"layer {layer + 1}", fontsize=7)
    axes[0, 0].set_title("input", fontsize=7)
    fig.suptitle("Attention of the output token to the patches, per layer (mean over heads)", fontsize=9)
    return fig
