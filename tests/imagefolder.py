"""A tiny generated ImageFolder shared by the training tests: class = dominant colour channel; and generated JPEG
"photos" of any size."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np
from PIL import Image


def tiny_folder(root: Path, *, per_class: int = 16, test_per_class: int = 4, size: int = 8) -> Path:
    """Write ``root/{train,test}/class{0,1,2}/NN.png`` (easy to learn, deterministic) and return ``root``."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", test_per_class)):
        for c in range(3):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i:02d}.png")
    return root


@functools.cache
def photo_jpeg(w: int, h: int, c: int) -> bytes:
    """A ``w`` x ``h`` JPEG "photo" of class ``c`` (its dominant colour), small on disk (blocky noise, low quality)."""
    rng = np.random.default_rng(c)
    small = rng.integers(0, 60, (max(1, h // 64), max(1, w // 64), 3)).astype(np.uint8)
    small[..., c] += 150
    buf = io.BytesIO()
    Image.fromarray(small).resize((w, h), Image.Resampling.NEAREST).save(buf, "JPEG", quality=20)
    return buf.getvalue()


def photo_folder(root: Path, *, size: tuple[int, int], train: int, val: int, classes: int = 2) -> Path:
    """``root/{train,val}/c{k}/N.jpg``: ``train`` and ``val`` :func:`photo_jpeg` photos of ``size`` (width, height) a
    class; returns ``root``."""
    for split, n in (("train", train), ("val", val)):
        for c in range(classes):
            d = root / split / f"c{c}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (d / f"{i}.jpg").write_bytes(photo_jpeg(*size, c))
    return root
