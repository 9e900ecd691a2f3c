"""Images for the analyses: files given by the user, a labelled data set, or the
embedded scikit-learn digits, turned into model inputs.

Everything flows as uint8 ``(N, H, W, C)`` arrays (the layout of :mod:`vitlab.data`);
labelled data comes from ``vitlab.data.load_data``, so ``--data`` takes every value
``vitlab train`` takes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..data.images.decode import match_channels
from ..data.images.user_files import image_files, read_image

__all__ = [
    "LabelledSplit",
    "digits_images",
    "labelled_splits",
    "preprocess",
    "read_images",
    "sample_split",
    "to_chw",
]


@dataclass
class LabelledSplit:
    """One split: all labels up front, images on request (``get(indices)`` -> uint8 NHWC), so a
    source that decodes lazily can be plugged in without touching the callers."""

    labels: np.ndarray
    get: Callable[[np.ndarray], np.ndarray]
    class_names: list[str]
    name: str = "test"
    """The split's name: its folder's (``val``, ``validation``, ``test``), ``train``, or a built-in set's."""

    def __len__(self) -> int:
        return len(self.labels)


def read_images(
    paths: Sequence[str | os.PathLike[str]], *, limit: int | None = None, max_pixels: int | None = None
) -> tuple[list[np.ndarray], list[str]]:
    """Decode image files (folders are searched recursively) as RGB uint8 ``(H, W, 3)`` arrays with
    :func:`vitlab.data.images.user_files.read_image`; also returns the names."""
    files = image_files(paths)[:limit]
    return [read_image(f, max_pixels=max_pixels) for f in files], [f.name for f in files]


def digits_images(n: int = 4) -> tuple[np.ndarray, list[str]]:
    """The first ``n`` of scikit-learn's embedded 8x8 digits (one per class first), uint8 ``(n, 8, 8, 1)``."""
    from ..data.sources import digits_arrays

    images, labels = digits_arrays()
    order = np.concatenate([np.flatnonzero(labels == c)[:1] for c in range(10)] + [np.arange(len(labels))])
    _, first = np.unique(order, return_index=True)
    order = order[np.sort(first)][:n]
    return images[order], [f"digit {labels[i]}" for i in order]


def to_chw(img: np.ndarray, in_chans: int) -> torch.Tensor:
    """A uint8 ``(H, W[, C])`` image as a ``(in_chans, H, W)`` uint8 tensor, channels matched as
    everywhere in vitlab (:func:`~vitlab.data.images.decode.match_channels`: grey repeated, RGB -> luma)."""
    t = torch.from_numpy(np.array(img, dtype=np.uint8))  # a copy: decoded arrays may be read-only
    if t.ndim == 2:
        t = t[..., None]
    return match_channels(t.permute(2, 0, 1), in_chans).contiguous()


def preprocess(
    images: Sequence[np.ndarray] | np.ndarray, *, img_size: tuple[int, int], in_chans: int, mean, std
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``(H, W, C)`` images -> ``(model input (B, C, H, W) normalised, display images (B, H, W, C) in [0, 1])``.

    Images are resized to ``img_size`` (bilinear, antialiased); channels are matched by :func:`to_chw`.
    """
    batch = []
    for img in images:
        t = to_chw(img, in_chans)
        t = t.float()[None] / 255.0
        if tuple(t.shape[-2:]) != tuple(img_size):
            # torch's own antialiased bilinear resize (what torchvision's resize calls)
            t = torch.nn.functional.interpolate(
                t, size=tuple(img_size), mode="bilinear", align_corners=False, antialias=True
            ).clamp(0, 1)
        batch.append(t[0])
    x = torch.stack(batch)
    display = x.permute(0, 2, 3, 1).clone()
    m = torch.tensor(mean[:in_chans] if len(mean) >= in_chans else mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std[:in_chans] if len(std) >= in_chans else std, dtype=torch.float32).view(1, -1, 1, 1)
    return (x - m) / s, display


def labelled_splits(
    data: str,
    *,
    size: int | None = None,
    crop: int | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[LabelledSplit, LabelledSplit]:
    """``(train, evaluation)`` splits of a ``--data`` value, through :func:`vitlab.data.load_data`
    (``digits``, ``cifar10``, an ImageFolder path: everything ``vitlab train`` takes); ``size``
    is the side a folder of mixed-size images is decoded to, and with ``crop`` every image, stored for the
    evaluation that crops it (``load_data``'s ``size`` and ``crop``); ``cache_dir``: where a folder's decode cache
    is (``--cache-dir``; default ``$VITLAB_CACHE`` or ``~/.cache/vitlab``)."""
    from ..data import load_data

    splits = load_data(data, size=size, crop=crop, progress=progress, cache_dir=cache_dir)
    names = list(splits.class_names)

    def split(s, name: str) -> LabelledSplit:
        images = s.images
        return LabelledSplit(
            labels=np.asarray(s.labels, dtype=np.int64),
            get=lambda idx: np.asarray(images[np.asarray(idx, dtype=np.int64)]),
            class_names=names,
            name=name,
        )

    return split(splits.train, "train"), split(splits.val, splits.val_name)


def sample_split(
    data: str,
    n: int,
    *,
    size: int | None = None,
    crop: int | None = None,
    val_split: float | None = None,
    max_pixels: int | None = None,
    seed: int = 0,
) -> tuple[list[np.ndarray], list[str], str]:
    """``(images, their class names, the split's name)``: ``n`` images drawn (``seed``) from the evaluation split of
    a ``--data`` value, decoding only those. A folder's files are listed (no pixels read), ``n`` of its evaluation split
    drawn, and those decoded one by one (:func:`~vitlab.data.images.decode.decode_image`) -- never the whole folder, nor
    its training split, into a decode cache. ``size`` and ``crop``: as the evaluation stores them (the shorter side
    resized to ``size``, then the centre ``crop``: the pixels ``vitlab eval`` feeds the model); ``None``: at their own
    size. The evaluation split is the folder's ``val/`` (or ``test/``), else the fraction ``val_split`` (default
    :data:`~vitlab.data.sources.DEFAULT_HOLD_OUT`) held out as training holds it out. The built-in data sets are in
    memory already: drawn from their evaluation split. A file that does not decode is passed over."""
    from ..data.images.decode import MAX_ASPECT, decode_image
    from ..data.images.scan import scan_classes
    from ..data.sources import DEFAULT_HOLD_OUT, DataSource, eval_split_dir, stratified_split

    rng = np.random.default_rng(seed)
    root = DataSource.named(data).folder
    if root is None:  # digits, cifar10, cifar100: arrays already
        _, test = labelled_splits(data)
        idx = rng.permutation(len(test.labels))[:n]
        names = [test.class_names[int(test.labels[i])] for i in idx]
        return list(test.get(idx)), names, test.name
    seen: dict[tuple[int, int], str] = {}
    val_dir = eval_split_dir(root) if val_split is None else None
    if val_dir is not None:
        _, _, classes = scan_classes(root / "train", None, seen=seen, problems=[])
        paths, labels, _ = scan_classes(val_dir, classes, seen=seen, problems=[])
        split = val_dir.name
    else:
        tree = root / "train" if (root / "train").is_dir() else root
        paths, labels, classes = scan_classes(tree, None, problems=[])
        _, held = stratified_split(labels, val_split or DEFAULT_HOLD_OUT, seed=0)
        paths, labels, split = [paths[i] for i in held], labels[held], "val"
    images, names = [], []
    for i in rng.permutation(len(paths)):
        if len(images) == n:
            break
        try:
            arr = decode_image(paths[i], size=size, crop=crop, max_pixels=max_pixels, max_aspect=MAX_ASPECT)
        except Exception:  # unreadable: the next one
            continue
        if size is not None and crop is not None and crop < size:
            # the evaluation's centre crop of the stored square (torchvision's CenterCrop offset), which the decoder
            # placed so that it is the centre crop of the whole resized image (data.resize.centre_square)
            at = round((size - crop) / 2.0)
            arr = arr[at : at + crop, at : at + crop]
        images.append(arr)
        names.append(classes[int(labels[i])])
    return images, names, split
