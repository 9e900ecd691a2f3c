"""Per-sample augmentation seeds (:mod:`vitlab.data.pipeline.seeding`): a sample's draws are a function of (seed, epoch,
index) alone, the caller's streams are not advanced, and no accelerator generator is touched (a GPU run's dropout
and token dropping keep their own stream; seeding only the CPU generator also spares torch's lazy CUDA seeding,
which formats a stack trace per call)."""

from __future__ import annotations

import random

import numpy as np
import torch

from vitlab.data.pipeline.seeding import SeededItems, item_seed, seeded


class _Draws(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[float, ...]:
        return tuple(torch.rand(2).tolist())


def test_a_sample_draws_the_same_whoever_asks_and_leaves_the_callers_streams() -> None:
    items = SeededItems(_Draws(), seed=3, epoch=1)
    torch.manual_seed(0)
    before = torch.rand(1).item()
    torch.manual_seed(0)
    forward = [items[i] for i in range(4)]
    after = torch.rand(1).item()
    assert after == before  # the caller's draws are those it would have made without the samples
    assert [items[i] for i in reversed(range(4))] == forward[::-1]  # order does not matter
    assert forward[0] != forward[1]
    assert SeededItems(_Draws(), seed=3, epoch=2)[0] != forward[0]
    assert item_seed(3, 1, 0) != item_seed(3, 1, 1) != item_seed(3, 2, 1)


def test_seeding_a_sample_touches_no_accelerator_generator(monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("a sample's seed reached an accelerator generator")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", refuse)
    monkeypatch.setattr(torch.cuda, "manual_seed", refuse)
    with seeded(5):
        a = torch.rand(2)
    with seeded(5):
        assert torch.equal(torch.rand(2), a)


def test_python_and_numpy_streams_are_not_reseeded_per_sample() -> None:
    """Augmentation draws from torch alone: a sample leaves ``random`` and ``np.random`` as they were, and a draw
    from them inside the block continues the caller's stream (they are not reseeded per sample)."""
    random.seed(1)
    np.random.seed(1)
    want = [random.random() for _ in range(2)], np.random.rand(2).tolist()
    random.seed(1)
    np.random.seed(1)
    with seeded(7):
        inside = random.random(), float(np.random.rand())
    after = random.random(), float(np.random.rand())
    assert [inside[0], after[0]] == want[0]
    assert [inside[1], after[1]] == want[1]
