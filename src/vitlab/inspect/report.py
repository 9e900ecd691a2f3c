"""``vitlab inspect`` end to end: run every analysis on a model, write the PNG figures,
``inspect.json`` with the numbers, and one self-contained ``report.html``.

The HTML embeds every figure as a ``data:image/png;base64`` URI and references no
external file, script or style sheet, so it opens in any browser, offline, and can
be mailed as one file.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._fs import atomic_write_bytes, atomic_write_text, output_error
from .._progress import ProgressLog
from .._text import size_px
from .._units import counted
from ..devices import model_device
from . import figures
from .attention import (
    attention_distance,
    output_token_attention,
    pixel_grid,
    rollout_map,
    uniform_attention_distance,
)
from .data_gallery import Gallery, data_check_gallery
from .embeddings import filter_pca, patch_position_embeddings, posemb_similarity
from .images import preprocess

__all__ = ["Section", "inspect_model", "render_html", "training_artifacts"]


@dataclass
class Section:
    """One block of the report: a heading, an explanation and (usually) one figure."""

    title: str
    text: str = ""
    png: bytes | None = None
    filename: str | None = None
    table: dict[str, Any] | None = None
    gallery: Gallery | None = None
    """Rows of small thumbnails, each ``(caption, [(label, JPEG bytes or None), ...])`` (the data check's groups)."""


def render_html(sections: Sequence[Section], *, title: str, subtitle: str = "") -> str:
    """A standalone HTML page; figures are inlined as base64 PNGs."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}img{max-width:100%;height:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
        ".note{color:#555}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if subtitle:
        parts.append(f'<p class="note">{html.escape(subtitle)}</p>')
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.text:
            parts.append(f"<p>{html.escape(s.text)}</p>")
        if s.table:
            rows = "".join(
                f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in s.table.items()
            )
            parts.append(f"<table>{rows}</table>")
        for caption, pictures in s.gallery or ():
            cells = []
            for label, jpeg in pictures:
                img = (
                    f'<img alt="{html.escape(label, quote=True)}" src="data:image/jpeg;base64,'
                    f'{base64.b64encode(jpeg).decode("ascii")}"><br>'
                    if jpeg is not None
                    else ""
                )
                cells.append(f'<figure style="display:inline-block;margin:.3em;vertical-align:top;max-width:12em">'
                             f'{img}<figcaption class="note">{html.escape(label)}</figcaption></figure>')  # fmt: skip
            parts.append(f"<p>{html.escape(caption)}</p><div>{''.join(cells)}</div>")
        if s.png is not None:
            b64 = base64.b64encode(s.png).decode("ascii")
            alt = html.escape(s.title, quote=True)
            parts.append(f'<p><img alt="{alt}" src="data:image/png;base64,{b64}"></p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def training_artifacts(model_dir: str | os.PathLike[str] | None) -> tuple[Path | None, list[Section]]:
    """Sections for the figures ``vitlab train --out DIR`` leaves next to ``DIR/model``, and its data check's findings
    with thumbnails (:mod:`.data_gallery`).

    ``model_dir`` may be the run folder itself or its ``model/`` sub-folder.
    Returns ``(run folder or None, sections)``.
    """
    if model_dir is None:
        return None, []
    p = Path(model_dir)
    if not p.is_dir():
        return None, []
    run = next((d for d in (p, p.parent) if (d / "summary.json").is_file() or (d / "curves.png").is_file()), None)
    if run is None:
        return None, []
    sections: list[Section] = []
    summary = run / "summary.json"
    if summary.is_file():
        try:
            data = json.loads(summary.read_text())
        except ValueError:
            data = None
        if isinstance(data, dict):
            flat = {k: _readable(v) for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
            sections.append(Section(title="Training summary", text=f"From {summary}.", table=flat))
    figures = (
        ("curves.png", "Training curves"),
        ("health.png", "Attention health"),
        ("confusion.png", "Confusion matrix"),
        ("reliability.png", "Reliability diagram (calibrated probabilities)"),
    )
    for name, title in figures:
        f = run / name
        if f.is_file():
            sections.append(
                Section(title=title, text=f"Written by vitlab train ({f}).", png=f.read_bytes(), filename=name)
            )
    if (found := data_check_gallery(run)) is not None:
        text, rows, counts = found
        sections.append(Section(title="Data check", text=text, table=counts, gallery=rows))
    return run, sections


def _readable(v: Any) -> Any:
    """A number as a table shows it: floats to 4 significant digits (``32.46``, not ``32.458161920000066``)."""
    return float(f"{v:.4g}") if isinstance(v, float) else v


@torch.no_grad()
def _mean_distance(model: nn.Module, x: torch.Tensor, *, batch_size: int, progress: bool) -> torch.Tensor:
    """Fig. 7 right over the whole batch ``x``, in chunks (exact attention is memory hungry)."""
    size = tuple(x.shape[-2:])
    grid, px = pixel_grid(model, size)
    total, n = None, 0
    starts = range(0, len(x), batch_size)
    log = ProgressLog(total=len(starts), desc="attention distance", unit="batch", enabled=progress and len(starts) > 1)
    for i in log.wrap(starts):
        xb = x[i : i + batch_size].to(model_device(model))
        _, attns = model(xb, return_attention=True)
        d = attention_distance(attns, grid=grid, patch_size=px, num_prefix_tokens=model.num_prefix_tokens) * len(xb)
        total = d if total is None else total + d
        n += len(xb)
    assert total is not None
    return total / n


@dataclass
class _Results:
    numbers: dict[str, Any] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)


def inspect_model(
    model: nn.Module,
    images: Sequence[np.ndarray] | np.ndarray,
    out_dir: str | os.PathLike[str],
    *,
    names: Sequence[str] | None = None,
    distance_images: Sequence[np.ndarray] | np.ndarray | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    title: str | None = None,
    max_display: int = 4,
    batch_size: int = 32,
    progress: bool = True,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Run Fig. 6 and Fig. 7 on ``model`` and write ``out_dir/{*.png, inspect.json, report.html}``.

    Args:
        images: uint8 ``(H, W, C)`` images for the rollout figures (the first ``max_display``).
        distance_images: the batch the mean attention distance is averaged over
            (defaults to ``images``).
        model_dir: where the model came from; training curves and the confusion
            matrix found there (``vitlab train`` output) are added to the report.
        notes: what a reader must know to read the figures right (random weights, where the images
            came from); shown under the title and kept in ``inspect.json``.

    Returns the numbers written to ``inspect.json`` plus ``"files"``.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e, what="the report") from None
    model.eval()
    cfg = model.config
    res = _Results()
    res.numbers["model"] = {
        "name": cfg.name,
        "img_size": list(cfg.img_size),
        "patch_size": cfg.patch_size,
        "depth": cfg.depth,
        "heads": cfg.num_heads,
    }
    files: list[str] = []

    def add(section: Section) -> None:
        if section.png is not None and section.filename:
            atomic_write_bytes(out / section.filename, section.png)
            files.append(str(out / section.filename))
        res.sections.append(section)

    # Fig. 7 left: patch-embedding filters.
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    weight = getattr(proj, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 4 and weight.shape[1] == cfg.in_chans:
        comps, explained = filter_pca(weight, 28)
        res.numbers["filter_pca_explained_variance"] = [round(float(v), 6) for v in explained]
        add(
            Section(
                title="Fig. 7 (left): principal components of the patch-embedding filters",
                text=f"The first {len(comps)} principal components of the {weight.shape[0]} linear-embedding filters "
                "(each a C x P x P patch), each tile scaled to [0, 1]; percentages are the variance each explains.",
                png=figures.png_bytes(figures.plot_filter_pcs(comps, explained)),
                filename="filters_pca.png",
            )
        )

    # Fig. 7 centre: position-embedding similarity.
    else:
        add(
            Section(
                title="Fig. 7 (left): principal components of the patch-embedding filters",
                text="Skipped: this model's patch projection does not act on image pixels (a hybrid model embeds "
                "CNN feature maps), so its filters cannot be shown as image patches.",
            )
        )

    pe = patch_position_embeddings(model)
    if pe is not None:
        sim = posemb_similarity(pe, cfg.grid_size)
        add(
            Section(
                title="Fig. 7 (center): position embedding similarity",
                text=f"Cosine similarity between the position embedding ({cfg.posemb}) of the patch at each row "
                "and column of the input grid and those of all other patches.",
                png=figures.png_bytes(figures.plot_posemb_similarity(sim)),
                filename="posemb_similarity.png",
            )
        )

    # Fig. 7 right and Fig. 6 need images.
    prep = {"img_size": cfg.img_size, "in_chans": cfg.in_chans, "mean": cfg.mean, "std": cfg.std}
    x_show, display = preprocess(list(images)[:max_display], **prep)
    x_dist = x_show if distance_images is None else preprocess(list(distance_images), **prep)[0]
    size = tuple(x_show.shape[-2:])
    grid, px = pixel_grid(model, size)
    dist = _mean_distance(model, x_dist, batch_size=batch_size, progress=progress)
    uniform = uniform_attention_distance(grid, px)
    res.numbers["mean_attention_distance"] = {
        "pixels_per_patch": px,
        "num_images": len(x_dist),
        "uniform_attention_distance": round(uniform, 4),
        "per_layer_head": [[round(float(v), 4) for v in row] for row in dist],
    }
    add(
        Section(
            title="Fig. 7 (right): mean attention distance",
            text="For every head of every layer: attention-weighted pixel distance between query and key patch "
            f"centres, averaged over query patches and {len(x_dist)} image(s). The class token is left out and "
            f"each query's weights over the patches renormalised; uniform attention would give {uniform:.1f} px "
            "on this grid.",
            png=figures.png_bytes(figures.plot_attention_distance(dist, img_size=size)),
            filename="attention_distance.png",
        )
    )

    with torch.no_grad():
        _, attns = model(x_show.to(model_device(model)), return_attention=True)
    attns = [a.float().cpu() for a in attns]
    maps = rollout_map(attns, grid=grid, num_prefix_tokens=model.num_prefix_tokens)
    token = "class token" if model.num_prefix_tokens else "mean over tokens (no class token)"
    add(
        Section(
            title="Fig. 6: attention rollout from the output token to the input",
            text="Abnar & Zuidema (2020): attention averaged over heads, plus the identity for the residual path, "
            f"rows renormalised, multiplied over all {len(attns)} layers; the output token is the {token}. "
            "Middle column: the image multiplied by the normalised map, as in the paper.",
            png=figures.png_bytes(
                figures.plot_rollout(display, maps, titles=list(names)[: len(display)] if names else None)
            ),
            filename="attention_rollout.png",
        )
    )
    layer_maps = output_token_attention(attns, grid=grid, num_prefix_tokens=model.num_prefix_tokens)
    add(
        Section(
            title="Raw attention of the output token, per layer",
            text="Head-averaged attention weights of the output token to each patch at every layer (no rollout).",
            png=figures.png_bytes(figures.plot_layer_attention(display, layer_maps)),
            filename="layer_attention.png",
        )
    )

    if names:
        res.numbers["images"] = list(names)[: len(display)]
    if notes:
        res.numbers["notes"] = list(notes)
    run_dir, train_sections = training_artifacts(model_dir)
    for s in train_sections:
        res.sections.append(s)
    if run_dir is not None:
        res.numbers["training_run"] = str(run_dir)

    atomic_write_text(out / "inspect.json", json.dumps(res.numbers, indent=2) + "\n")
    files.append(str(out / "inspect.json"))
    page = render_html(
        res.sections,
        title=title or f"vitlab inspect: {cfg.name}",
        subtitle=f"{cfg.name}: {counted(cfg.depth, 'layer')}, width {cfg.embed_dim}, {counted(cfg.num_heads, 'head')}, "
        f"patch {cfg.patch_size}, "
        f"{size_px(cfg.img_size)}, pooling {cfg.pool}, position embedding {cfg.posemb}. "
        "Figure numbers refer to Dosovitskiy et al., ICLR 2021." + "".join(f" {n}" for n in notes),
    )
    atomic_write_text(out / "report.html", page)
    files.append(str(out / "report.html"))
    res.numbers["files"] = files
    return res.numbers
