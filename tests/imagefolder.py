"""A tiny generated ImageFolder shared by the training tests: class = dominant colour channel."""

from __future__ import annotations

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
