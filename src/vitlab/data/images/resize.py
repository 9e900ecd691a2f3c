"""The geometry of the evaluation's resize and centre crop, shared by the decoder (:mod:`vitlab.data.images.decode`) and
the transforms (:mod:`vitlab.data.pipeline.transforms`): torchvision's ``Resize(int)`` and ``CenterCrop`` rules, which
timm's evaluation transform follows, so that a stored image, vitlab's transform and timm's agree to the pixel."""

from __future__ import annotations

import math

__all__ = ["centre_square", "resize_side", "resized_shape"]


def resized_shape(width: int, height: int, size: int) -> tuple[int, int]:
    """``(width, height)`` once the shorter side is resized to ``size``: torchvision's ``Resize(size)`` rule, the
    longer side ``int(size * longer / shorter)`` (floored), which timm's evaluation transform and vitlab's
    (:func:`vitlab.data.eval_transform`) follow, so a stored image has the shape they give the same file."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def centre_square(width: int, height: int, size: int, crop: int | None = None) -> tuple[int, int, int, int]:
    """The box ``(left, top, right, bottom)`` of the ``size`` x ``size`` square that
    :func:`~vitlab.data.images.decode.decode_image` keeps of a ``width`` x ``height`` image whose shorter side is
    ``size``: placed so that the centre ``crop`` x ``crop`` of the square (``crop`` defaults to ``size``), taken
    as torchvision's ``CenterCrop`` takes it (offset ``int(round((side - crop) / 2.0))``), is ``CenterCrop(crop)``
    of the whole image. The evaluation crops the stored square so, and the two crops together are the one of
    timm's transform (one offset rule cannot be both: rounding halves to even, 1 + 1 = 2 but round(0.5) +
    round(0.5) = 0)."""
    c = size if crop is None else crop
    if min(width, height) != size or not 0 < c <= size:
        raise ValueError(f"centre_square: a {width}x{height} image, square {size}, crop {c}")
    left = _centre(width, c) - _centre(size, c)
    top = _centre(height, c) - _centre(size, c)
    return left, top, left + size, top + size


def _centre(side: int, crop: int) -> int:
    """Where torchvision's ``CenterCrop`` starts a crop of ``crop`` on a side of ``side``."""
    return round((side - crop) / 2.0)  # Python's round: half to even, as torchvision's


def resize_side(side: int, crop_pct: float) -> int:
    """The side evaluation resizes to before its centre crop of ``side``: ``floor(side / crop_pct)``, timm's
    ``crop_pct`` rule (``transforms_factory.transforms_imagenet_eval``), so that timm's transform of a vitlab
    model's ``pretrained_cfg`` gives vitlab's pixels."""
    return math.floor(side / crop_pct) if crop_pct < 1 else side
