"""Evaluation at each image's own aspect ratio (NaViT, Dehghani et al. 2023): no square resize, no centre crop.

Each image is resized, aspect ratio kept, to the largest patch grid within a token budget (by default the
model's own: as many patches as its training resolution has, :func:`~vitlab.data.pipeline.navit.native_grid`), and
the images go to the model packed (:class:`~vitlab.models.packed.PackedPatches`). One resolution per call:
evaluating at several (``resolution=``) shows how one model serves them all.

A square image at the model's resolution is what the usual path (:func:`.accuracy.model_inputs`) gives it,
so both agree there; other shapes keep their whole picture where the usual path crops its centre.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.pipeline.navit import Patchify, SequenceBatches, SizedImages
from ..devices import resolve_device
from ..errors import ConfigError
from ..models.packed import PackedPatches, pack
from .accuracy import evaluate_batches

__all__ = ["evaluate_native", "native_batches", "native_inputs", "native_patchify"]


def native_patchify(model: nn.Module, *, resolution: float | None = None) -> Patchify:
    """The evaluation's :class:`~vitlab.data.pipeline.navit.Patchify` for ``model``: its patch size, mean, std and
    channels, every image at the token budget of a square ``resolution`` pixels wide (default: the side of a
    square of the model's own image area, so the budget is its number of patches)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(model, "forward_packed"):
        raise ConfigError("native aspect ratio: needs a vitlab VisionTransformer (not an exported folder)")
    side = float(resolution) if resolution is not None else math.sqrt(cfg.img_size[0] * cfg.img_size[1])
    if not side >= cfg.patch_size:
        raise ConfigError(f"--native-res {resolution}: must be at least the patch size {cfg.patch_size}")
    return Patchify(
        patch_size=cfg.patch_size, resolution=(side, side), mean=cfg.mean, std=cfg.std, in_chans=cfg.in_chans
    )


def native_inputs(model: nn.Module, images: Sequence[np.ndarray], *, resolution: float | None = None) -> PackedPatches:
    """Decoded uint8 ``(H, W, C)`` images of any sizes as ``model``'s packed input, one image to a sequence
    (no padding but what the grid leaves): ``model(native_inputs(model, images))`` is ``(len(images), classes)``."""
    pf = native_patchify(model, resolution=resolution)
    prefix = model.num_prefix_tokens
    return pack([[pf(x)] for x in images], seq_len=pf.max_tokens + prefix, prefix_tokens=prefix)


def native_batches(
    model: nn.Module,
    source: Any,
    *,
    resolution: float | None = None,
    pack_len: int | None = None,
    sequences: int = 32,
    workers: int = 0,
    num_classes: int | None = None,
    label_map: np.ndarray | None = None,
    stats: dict[str, float] | None = None,
    rank: int = 0,
    world: int = 1,
    worker_init_fn: Callable[[int], None] | None = None,
    sized: SizedImages | None = None,
) -> Iterator[tuple[PackedPatches, torch.Tensor]]:
    """``(packed images, labels)`` batches of an evaluation split (decoded images and labels, or tar shards with
    ``num_classes`` and ``label_map``) in its own order, ``sequences`` packed sequences a batch of ``pack_len``
    tokens (default: one image's budget, so one image a sequence; longer ones pack several, at the cost of
    attention over the masked pairs). ``stats`` receives the padding fraction at the end. ``rank`` of ``world``:
    this process's share of the split (positions ``rank``, ``rank + world``, ...); ``worker_init_fn``: the
    DataLoader workers'. ``sized``: the split's images kept resized (:class:`SizedImages`) by this model's
    :func:`native_patchify` at ``resolution``, for a caller that evaluates the same split again (a training run,
    every epoch)."""
    pf = native_patchify(model, resolution=resolution)
    if sized is not None:
        if sized.patchify != pf:
            raise ConfigError("native aspect ratio: the kept images were resized for another model or resolution")
        pf = sized.patchify
    prefix = model.num_prefix_tokens
    loader = SequenceBatches(
        source=source,
        patchify=pf,
        pack_len=pack_len or pf.max_tokens + prefix,
        sequences=sequences,
        prefix_tokens=prefix,
        shuffle=False,
        workers=workers,
        num_classes=num_classes,
        label_map=label_map,
        rank=rank,
        world=world,
        worker_init_fn=worker_init_fn,
        sized=sized,
    )
    for batch in loader:
        yield batch.packed, batch.labels
    if stats is not None:
        stats["padding"] = loader.padding_fraction


def evaluate_native(
    model: nn.Module,
    source: Any,
    *,
    num_classes: int | None = None,
    device: str | torch.device = "cpu",
    amp_dtype: torch.dtype | None = None,
    resolution: float | None = None,
    pack_len: int | None = None,
    sequences: int = 32,
    workers: int = 0,
    label_map: np.ndarray | None = None,
) -> dict[str, Any]:
    """:func:`.accuracy.evaluate_batches`'s report (top-1, top-5, loss, per class, confusion) for ``model`` on
    ``source`` at native aspect ratio (:func:`native_batches`), with ``resolution`` (the side whose token budget
    each image gets) and ``padding`` (the fraction of token slots without an image) added."""
    dev = resolve_device(device)
    model.to(dev)
    classes = num_classes or model.config.num_classes
    stats: dict[str, float] = {}
    batches = native_batches(
        model,
        source,
        resolution=resolution,
        pack_len=pack_len,
        sequences=sequences,
        workers=workers,
        num_classes=classes,
        label_map=label_map,
        stats=stats,
    )
    res = evaluate_batches(model, batches, num_classes=classes, device=dev, amp_dtype=amp_dtype)
    res["resolution"] = native_patchify(model, resolution=resolution).resolution[0]
    res["padding"] = stats.get("padding", 0.0)
    return res
