"""What a decode cache will hold, from the files' headers alone: each image's size once decoded, whether they
must share one size, and the windows of images decoded at once within the memory budget
(:func:`vitlab.data.cache.store.decode_files`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..images.decode import DEFAULT_MAX_IMAGE_PIXELS, header_sizes, too_thin, typical_side
from ..images.resize import resized_shape

__all__ = ["Layout", "cache_layout", "windows"]


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a build stores, from the files' headers: each file's ``(height, width)`` once decoded (``None``: its
    header cannot be read, or the decoder will refuse it), whether they must all share one size (``uniform``),
    and the resize options handed to :func:`~vitlab.data.images.decode.decode_image`."""

    shapes: list[tuple[int, int] | None]
    uniform: bool
    size: int | None = None
    shorter_side: int | None = None
    native: bool = False
    """Every image stored at its own (decoded) size, nothing resized or cropped: the pixels of any other request
    that stores them so too (a larger ``max_side``), which the cache of either then serves."""


def cache_layout(
    paths: Sequence[str],
    *,
    size: int | None,
    fallback_size: int | None,
    max_side: int | None,
    keep_aspect: bool,
    max_pixels: int | None,
    name: str,
) -> Layout:
    """The :class:`Layout` of decoding ``paths`` with :func:`~vitlab.data.cache.store.decode_files`'s options (see
    there); every header is read unless ``size`` fixes the shape."""
    if size is not None:
        return Layout(shapes=[(size, size)] * len(paths), uniform=True, size=size)
    headers = header_sizes(paths)
    if keep_aspect:  # each image at its own aspect ratio, its shorter side at most max_side
        limit = max_pixels or DEFAULT_MAX_IMAGE_PIXELS
        shapes: list[tuple[int, int] | None] = []
        shrunk = False
        for wh in headers:
            if wh is None or too_thin(*wh) or wh[0] * wh[1] > limit:
                shapes.append(None)  # decode_image says why
                continue
            shrink = max_side is not None and min(wh) > max_side
            shrunk |= shrink
            w, h = resized_shape(*wh, max_side) if shrink else wh
            shapes.append((h, w))
        return Layout(shapes=shapes, uniform=False, shorter_side=max_side, native=not shrunk)
    sizes: dict[tuple[int, int], int] = {}
    for wh in headers:
        if wh is not None:
            sizes[wh] = sizes.get(wh, 0) + 1
    if not sizes:
        raise ValueError(f"none of the {len(paths)} image files under {name} can be read")
    typical = {wh: n for wh, n in sizes.items() if not too_thin(*wh)} or sizes  # strips never set the size
    if len(typical) > 1:  # mixed sizes: square crops
        side = fallback_size or typical_side(typical)
        side = min(side, max_side) if max_side is not None else side
        return Layout(shapes=[(side, side)] * len(paths), uniform=True, size=side)
    width, height = max(typical, key=typical.__getitem__)
    if max_side is not None and min(height, width) > max_side:  # as decode_image(shorter_side=) shrinks
        width, height = resized_shape(width, height, max_side)
        return Layout(shapes=[(height, width)] * len(paths), uniform=True, shorter_side=max_side)
    return Layout(shapes=[(height, width)] * len(paths), uniform=True, native=True)


def windows(shape_bytes: list[int], budget: int) -> list[range]:
    """Consecutive ranges of images whose decoded bytes add up to at most ``budget`` (at least one image each)."""
    out, start, held = [], 0, 0
    for i, b in enumerate(shape_bytes):
        if i > start and held + b > budget:
            out.append(range(start, i))
            start, held = i, 0
        held += b
    if start < len(shape_bytes):
        out.append(range(start, len(shape_bytes)))
    return out
