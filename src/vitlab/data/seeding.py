"""Per-sample augmentation randomness: each training sample's random draws are a pure function of
``(seed, epoch, sample)``, so neither the process that decodes it (the training process or a DataLoader
worker, whichever worker), nor the point in the epoch where a resumed run's loader started, can change
them. A resumed run then sees the images the uninterrupted run saw, bit for bit, with any number of workers.

The draws are made inside a fork of the global generators (torch's CPU generator, Python's ``random``,
NumPy's legacy global one), seeded for the sample and restored afterwards: the caller's own random
streams (MixUp, stochastic depth, token dropping in the training process) are not advanced by augmentation.
"""

from __future__ import annotations

import contextlib
import random
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
    """Run the block with torch's CPU generator, ``random`` and ``np.random`` seeded ``seed``; their previous
    states are restored afterwards (the block's draws leave no trace in the caller's streams)."""
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # the CPU generator only: what fork_rng restores
        random.seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


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
