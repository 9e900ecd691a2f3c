"""The images an export is checked (``--check-data``) and calibrated (``--calib-data``) on, decoded and
preprocessed the way ``vitlab predict`` does it (:func:`~vitlab.data.images.user_files.read_image`, then
:func:`~vitlab.evaluate.model_inputs`: the model's own resize, crop, mean and std), so the report's
predictions are the ones a user gets from the exported folder.

A folder is an ImageFolder (``DIR/<class>/...``, or its ``val/`` or ``test/`` split when it has one: the
labels are the folder names) or any folder of images (no labels). Without a folder the check runs on
generated images: agreement only, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.images.user_files import image_files, read_image
from ..errors import DataError, InputError

__all__ = ["CheckImages", "folder_images", "generated_images"]


@dataclass
class CheckImages:
    """Preprocessed images with where they came from."""

    inputs: torch.Tensor
    """``(N, C, H, W)`` float, the model's inputs."""
    names: list[str]
    """The image files (``generated:i`` for generated images)."""
    labels: list[str | None]
    """Class folder of each image (None: unlabelled)."""
    source: str
    """The folder, or ``generated``."""
    skipped: list[str] = field(default_factory=list)
    """Files that could not be read (``path: why``)."""

    @property
    def labelled(self) -> bool:
        return bool(self.labels) and all(lab is not None for lab in self.labels)

    def describe(self) -> str:
        if self.source == "generated":
            return f"{len(self.names)} generated images (no --check-data: agreement only, no accuracy)"
        kinds = f"labelled, {len(set(self.labels))} classes" if self.labelled else "unlabelled"
        skipped = f"; {len(self.skipped)} unreadable skipped" if self.skipped else ""
        return f"{len(self.names)} images of {self.source} ({kinds}{skipped})"


def _spread(items: list, limit: int) -> list:
    """At most ``limit`` of ``items``, evenly spaced (every class of a sorted ImageFolder keeps its share)."""
    if len(items) <= limit:
        return items
    idx = np.unique(np.linspace(0, len(items) - 1, limit).round().astype(int))
    return [items[i] for i in idx]


def folder_images(model: torch.nn.Module, folder: str, *, limit: int, flag: str, max_pixels: int | None = None):
    """Up to ``limit`` images of ``folder`` as ``model``'s inputs (:class:`CheckImages`). ``flag`` names the
    option in errors."""
    from ..evaluate import model_inputs

    root = Path(folder)
    if not root.is_dir():
        raise DataError(
            f"{flag} {folder}: no such folder (an ImageFolder: DIR/<class>/<images>, or a folder of images)"
        )
    for split in ("val", "test"):
        if (root / split).is_dir():
            root = root / split
            break
    classes = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    pairs: list[tuple[Path, str | None]] = []
    for d in classes:
        try:
            pairs += [(f, d.name) for f in image_files([d])]
        except InputError:  # a class folder without images
            continue
    if not pairs:
        try:
            pairs = [(f, None) for f in image_files([root])]
        except InputError as e:
            raise DataError(f"{flag} {folder}: {e}") from None
    arrays, names, labels, skipped = [], [], [], []
    for f, label in _spread(pairs, limit):
        try:
            arrays.append(read_image(f, max_pixels=max_pixels))
        except InputError as e:
            skipped.append(str(e))
            continue
        names.append(str(f))
        labels.append(label)
    if not arrays:
        raise DataError(f"{flag} {folder}: none of the images could be read ({skipped[0]})")
    return CheckImages(model_inputs(model, arrays), names, labels, str(folder), skipped)


def generated_images(model: torch.nn.Module, count: int = 64, *, seed: int = 0) -> CheckImages:
    """``count`` generated images (smooth random colour fields, not noise: coarse blocks upsampled) as
    ``model``'s inputs."""
    from ..evaluate import model_inputs

    h, w = model.config.img_size
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(count, max(1, h // 8), max(1, w // 8), 3), dtype=np.uint8)
    arrays = [np.kron(c, np.ones((8, 8, 1), dtype=np.uint8))[:h, :w] for c in coarse]
    arrays = [np.pad(a, ((0, h - a.shape[0]), (0, w - a.shape[1]), (0, 0)), mode="edge") for a in arrays]
    return CheckImages(
        model_inputs(model, arrays), [f"generated:{i}" for i in range(count)], [None] * count, "generated"
    )
