"""Packing images into sequences (NaViT: Dehghani et al. 2023, "Patch n' Pack", Sec. 2.2): the two ways a stream
of patched images (in an epoch's order) becomes batches of fixed-length sequences, each image whole inside one
sequence, after its prefix slots (:mod:`vitlab.data.pipeline.navit` prepares the images and reads them in order).

- :func:`pack_batches`: a fixed number of sequences a batch, first fit in order; the first image that fits in
  none closes the batch (a fixed token budget per batch, NaViT's);
- :func:`pack_groups`: a fixed number of images a batch, first fit decreasing into as many sequences as needed.

Each batch is a contiguous run of the order and says where the order resumes after it
(:attr:`PackedBatch.next_position`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ...errors import ConfigError
from ...models.packed import PackedPatches, PatchTokens, pack

__all__ = ["PackSample", "PackedBatch", "pack_batches", "pack_groups"]


@dataclass(frozen=True)
class PackSample:
    """One image ready to pack: its tokens, class, and position in the epoch's order."""

    tokens: PatchTokens
    label: int
    position: int


@dataclass(frozen=True, kw_only=True)
class PackedBatch:
    """``packed`` (the model's input), ``labels`` ``(n,)`` and ``positions`` ``(n,)`` of its images in the
    order the model returns them, and ``next_position``: where the epoch resumes after this batch."""

    packed: PackedPatches
    labels: torch.Tensor
    positions: torch.Tensor
    next_position: int

    @property
    def padding(self) -> float:
        """The fraction of the batch's token slots that hold no image."""
        return self.packed.padding_fraction()


def _packed_batch(bins: list[list[PackSample]], *, pack_len: int, prefix_tokens: int, next_position: int):
    order = [s for b in bins for s in b]
    return PackedBatch(
        packed=pack([[s.tokens for s in b] for b in bins], seq_len=pack_len, prefix_tokens=prefix_tokens),
        labels=torch.tensor([s.label for s in order], dtype=torch.int64),
        positions=torch.tensor([s.position for s in order], dtype=torch.int64),
        next_position=next_position,
    )


def _need(s: PackSample, *, pack_len: int, prefix_tokens: int) -> int:
    need = s.tokens.patches.shape[0] + prefix_tokens
    if need > pack_len:
        raise ConfigError(f"--pack-len {pack_len}: an image takes {need} tokens; pass at least that")
    return need


def pack_batches(
    samples: Iterable[PackSample], *, pack_len: int, sequences: int, prefix_tokens: int
) -> Iterator[PackedBatch]:
    """Samples (in the epoch's order) packed first-fit into batches of ``sequences`` sequences of ``pack_len``
    tokens; an image that fits in no sequence of the batch closes it. The last batch may have empty sequences."""
    kw = {"pack_len": pack_len, "prefix_tokens": prefix_tokens}
    bins: list[list[PackSample]] = [[] for _ in range(sequences)]
    free = [pack_len] * sequences
    last = None
    for s in samples:
        need = _need(s, **kw)
        i = next((j for j, f in enumerate(free) if f >= need), None)
        if i is None:
            yield _packed_batch(bins, next_position=s.position, **kw)
            bins, free, i = [[] for _ in range(sequences)], [pack_len] * sequences, 0
        bins[i].append(s)
        free[i] -= need
        last = s.position
    if last is not None:
        yield _packed_batch(bins, next_position=last + 1, **kw)


def pack_groups(
    samples: Iterable[PackSample], *, pack_len: int, images: int, prefix_tokens: int, start: int = 0, stride: int = 1
) -> Iterator[PackedBatch]:
    """Every ``images`` samples (the last group may be smaller) as one batch: largest first, each into the first
    sequence of ``pack_len`` tokens with room for it, a new sequence when none has (first fit decreasing; ties in
    the samples' order). Batch ``k`` resumes at ``start + (k + 1) x images x stride`` (``stride``: the processes
    that share the order, each taking every ``stride``-th position)."""
    kw = {"pack_len": pack_len, "prefix_tokens": prefix_tokens}
    group: list[PackSample] = []
    k = 0
    for s in samples:
        group.append(s)
        if len(group) == images:
            yield _first_fit_decreasing(group, next_position=start + (k + 1) * images * stride, **kw)
            group, k = [], k + 1
    if group:
        yield _first_fit_decreasing(group, next_position=group[-1].position + 1, **kw)


def _first_fit_decreasing(group: list[PackSample], *, pack_len: int, prefix_tokens: int, next_position: int):
    needs = [_need(s, pack_len=pack_len, prefix_tokens=prefix_tokens) for s in group]
    bins: list[list[PackSample]] = []
    free: list[int] = []
    for i in sorted(range(len(group)), key=lambda i: -needs[i]):
        j = next((j for j, f in enumerate(free) if f >= needs[i]), None)
        if j is None:
            bins.append([])
            free.append(pack_len)
            j = len(bins) - 1
        bins[j].append(group[i])
        free[j] -= needs[i]
    return _packed_batch(bins, pack_len=pack_len, prefix_tokens=prefix_tokens, next_position=next_position)
