"""Per-sample augmentation randomness: each training sample's random draws are a pure function of
``(seed, epoch, sample)``, so neither the process that decodes it (the training process or a DataLoader
worker, whichever worker), nor the point in the epoch where a resumed run's loader started, can change
them. A resumed run then sees the images the uninterrupted run saw, bit for bit, with any number of workers.

The draws are made inside a fork of torch's CPU generator, seeded for the sample and restored afterwards:
the caller's own random streams (MixUp, stochastic depth, token dropping in the training process) are not
advanced by augmentation. It is the one generator augmentation draws from (torchvision's transforms and
vitlab's own crops and flips); Python's ``random`` and NumPy's global generator are left alone (seeding
NumPy's legacy generator costs more than a small image's whole augmentation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["SeededItems", "item_seed", "seeded"]


def item_seed(seed: int, epoch: int, index: int) -> int:
    """A 32-bit seed for sample ``index`` of epoch ``epoch`` of a run seeded ``seed`` (NumPy's ``SeedSequence``
    mixes the three, so neighbouring samples and epochs get unrelated streams)."""
    words = [int(v) % (1 << 63) for v in (seed, epoch, index)]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block with torch's CPU generator seeded ``seed``; its previous state is restored afterwards (the
    block's draws leave no trace in the caller's stream). Accelerator generators are not touched."""
    state = torch.default_generator.get_state()
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        torch.default_generator.set_state(state)


class SeededItems(Dataset):
    """A map-style dataset whose item ``i`` is drawn under :func:`seeded` with :func:`item_seed` ``(seed, epoch,
    i)``: the same augmented sample whichever process asks for it, and in whatever order."""

    def __init__(self, base: Dataset, *, seed: int, epoch: int) -> None:
        self.base, self.seed, self.epoch = base, seed, epoch

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        with seeded(item_seed(self.seed, self.epoch, i)):
            return self.base[i]
