"""Images at their own aspect ratio, packed into sequences (NaViT: Dehghani et al. 2023, "Patch n' Pack").

Each image of an epoch goes through four steps:

1. **a resolution**: the side ``R`` of a square of the image's area, drawn uniformly in ``resolution`` (NaViT's
   variable resolution, Sec. 3.2; one value for evaluation), gives a token budget ``floor((R / P)^2)``;
2. **its grid**: the largest patch grid of the image's aspect ratio within that budget (:func:`native_grid`);
   the image is resized to it (the evaluation's bicubic resize, :func:`vitlab.data.transforms.resize_image`),
   flipped or augmented, normalised;
3. **its patches** (:func:`~vitlab.models.packed.patchify`), of which token dropping keeps a random subset
   (NaViT Sec. 3.4, :func:`~vitlab.models.packed.drop_tokens`);
4. **packing**: images in the epoch's order fill a batch of ``sequences`` sequences of ``pack_len`` tokens, each
   image taking its patches plus the model's prefix tokens in the first sequence with room for it (first fit);
   the first image that fits in none closes the batch and opens the next one.

Steps 1-3 run in DataLoader workers (when ``workers > 0``); each image's random draws come from a generator
seeded by (seed, epoch, position), so they do not depend on the process that makes them. Packing runs in the
training process, in order.

**Position.** A batch holds a contiguous run of the epoch's order: its :attr:`PackedBatch.next_position` is the
number of images of the epoch consumed once it is trained on, the one integer a checkpoint stores to resume.
Starting an epoch's loader at that position (``start=``) gives exactly the batches that would have followed.

Sources: a decoded split (``vitlab.data.load_data``'s images, stored at their aspect ratio) read in a seeded
permutation, or tar shards through :class:`~vitlab.data.stream.ShardStream` (its order, decoded in its workers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ..errors import ConfigError, DataError
from ..models.packed import PackedPatches, PatchTokens, drop_tokens, pack, patchify
from .decode import decode_encoded, match_channels
from .seeding import item_seed, seeded
from .shard_source import ShardSet
from .stream import EpochOrder, ShardStream
from .transforms import _normalize, resize_image

__all__ = [
    "PackSample",
    "PackedBatch",
    "PackedLoader",
    "Patchify",
    "ShardPatchify",
    "native_grid",
    "pack_batches",
    "token_budget",
]


def token_budget(side: float, patch_size: int) -> int:
    """Patches of a square ``side`` pixels wide, ``floor((side / P)^2)`` (at least 1)."""
    return max(1, math.floor((side / patch_size) ** 2 + 1e-6))


def native_grid(height: int, width: int, *, patch_size: int, max_tokens: int) -> tuple[int, int]:
    """The patch grid ``(rows, cols)`` of an image ``height`` x ``width`` scaled, aspect ratio kept, to at most
    ``max_tokens`` patches: each side ``floor(side * s / P)`` for the scale ``s`` that makes the area
    ``max_tokens`` patches (at least one patch a side, never more than ``max_tokens`` in all)."""
    s = math.sqrt(max_tokens * patch_size * patch_size / (height * width))
    gh = max(1, min(max_tokens, math.floor(height * s / patch_size + 1e-6)))
    gw = max(1, min(max_tokens // gh, math.floor(width * s / patch_size + 1e-6)))
    return gh, gw


@dataclass(frozen=True, kw_only=True)
class Patchify:
    """A decoded image (uint8 ``(H, W, C)``) -> its :class:`~vitlab.models.packed.PatchTokens` (steps 1-3 above).

    ``resolution``: ``(low, high)`` side of the area-equivalent square in pixels, drawn uniformly per image
    (``(s, s)``: every image at the token budget of an ``s`` x ``s`` image). ``hflip``: probability of a
    horizontal flip; ``augment``: uint8 ``(C, H, W)`` -> same, applied at the packed size (RandAugment ...);
    ``token_drop``: the fraction of each image's patches dropped. Random draws use torch's global generator
    (seeded per sample by the loaders)."""

    patch_size: int
    resolution: tuple[float, float]
    mean: Sequence[float]
    std: Sequence[float]
    in_chans: int = 3
    hflip: float = 0.0
    token_drop: float = 0.0
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None
    _norm: v2.Compose = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lo, hi = self.resolution
        if not 0 < lo <= hi:
            raise ConfigError(f"resolution: expected 0 < low <= high, got {lo}, {hi}")
        if not 0.0 <= self.token_drop < 1.0:
            raise ConfigError(f"token drop rate: must be in [0, 1), got {self.token_drop}")
        object.__setattr__(self, "_norm", v2.Compose(_normalize(self.mean, self.std, self.in_chans)))

    @property
    def max_tokens(self) -> int:
        """The most patches an image can have (at the high resolution)."""
        return token_budget(self.resolution[1], self.patch_size)

    def __call__(self, image: np.ndarray | torch.Tensor) -> PatchTokens:
        x = image if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image, copy=True))
        if not isinstance(image, torch.Tensor):
            x = x.permute(2, 0, 1)
        x = match_channels(x, self.in_chans)
        lo, hi = self.resolution
        side = lo + (hi - lo) * float(torch.rand(())) if hi > lo else float(lo)
        p = self.patch_size
        gh, gw = native_grid(x.shape[1], x.shape[2], patch_size=p, max_tokens=token_budget(side, p))
        if (x.shape[1], x.shape[2]) != (gh * p, gw * p):
            x = resize_image(x, (gh * p, gw * p))
        if self.hflip > 0 and float(torch.rand(())) < self.hflip:
            x = x.flip(-1)
        if self.augment is not None:
            x = self.augment(x)
        tokens = patchify(self._norm(x), p)
        return drop_tokens(tokens, self.token_drop) if self.token_drop else tokens


@dataclass(frozen=True, kw_only=True)
class ShardPatchify:
    """The bytes of a tar shard's image -> :class:`Patchify`'s tokens (decoded at full resolution)."""

    patchify: Patchify

    def __call__(self, data: bytes) -> PatchTokens:
        return self.patchify(decode_encoded(data))


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


def pack_batches(
    samples: Iterable[PackSample], *, pack_len: int, sequences: int, prefix_tokens: int
) -> Iterator[PackedBatch]:
    """Samples (in the epoch's order) packed first-fit into batches of ``sequences`` sequences of ``pack_len``
    tokens; an image that fits in no sequence of the batch closes it. The last batch may have empty sequences."""
    bins: list[list[PackSample]] = [[] for _ in range(sequences)]
    free = [pack_len] * sequences

    def emit(next_position: int) -> PackedBatch:
        order = [s for b in bins for s in b]
        return PackedBatch(
            packed=pack([[s.tokens for s in b] for b in bins], seq_len=pack_len, prefix_tokens=prefix_tokens),
            labels=torch.tensor([s.label for s in order], dtype=torch.int64),
            positions=torch.tensor([s.position for s in order], dtype=torch.int64),
            next_position=next_position,
        )

    last = None
    for s in samples:
        need = s.tokens.patches.shape[0] + prefix_tokens
        if need > pack_len:
            raise ConfigError(f"--pack-len {pack_len}: an image takes {need} tokens; pass at least that")
        i = next((j for j, f in enumerate(free) if f >= need), None)
        if i is None:
            yield emit(s.position)
            bins, free, i = [[] for _ in range(sequences)], [pack_len] * sequences, 0
        bins[i].append(s)
        free[i] -= need
        last = s.position
    if last is not None:
        yield emit(last + 1)


class _FolderPatches(Dataset):
    """Position ``p`` of an epoch's order of decoded images -> :class:`PackSample` (in DataLoader workers)."""

    def __init__(self, images: Any, labels: np.ndarray, *, patchify: Patchify, order: EpochOrder) -> None:
        self.images, self.labels, self.patchify, self.order = images, labels, patchify, order

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, p: int) -> PackSample:
        i = int(self.order.offsets(np.asarray([p]))[0])
        if self.order.shuffle:  # the same draws whichever worker prepares it, and again after a resumption
            with seeded(item_seed(self.order.seed, self.order.epoch, p)):
                tokens = self.patchify(self.images[i])
        else:
            tokens = self.patchify(self.images[i])
        return PackSample(tokens, int(self.labels[i]), p)


def _as_list(items: list) -> list:
    return items


@dataclass(kw_only=True)
class PackedLoader:
    """One epoch of :class:`PackedBatch` from ``source``: a decoded split (an object with ``images`` and
    ``labels``, as ``load_data`` returns) or tar shards (a :class:`~vitlab.data.shard_source.ShardSet`).

    ``shuffle``: a seeded permutation of the epoch (training) with per-image random draws; else the source's own
    order without them (evaluation). ``start``: the position to resume at (a batch's ``next_position``).
    ``prefix_tokens``: the model's ``num_prefix_tokens``. ``chunk``: images per DataLoader batch of the workers.
    ``num_classes`` and ``label_map`` (class index in the shards -> the model's) for shards.
    :attr:`padding_fraction` is the padding of the batches yielded so far in the current pass."""

    source: Any
    patchify: Patchify
    pack_len: int
    sequences: int
    prefix_tokens: int
    seed: int = 0
    epoch: int = 0
    start: int = 0
    shuffle: bool = True
    workers: int = 0
    chunk: int = 32
    num_classes: int | None = None
    label_map: np.ndarray | None = None
    slots: int = field(default=0, init=False)
    padded: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        need = self.patchify.max_tokens + self.prefix_tokens
        if self.pack_len < need:
            raise ConfigError(
                f"--pack-len {self.pack_len}: an image may take {need} tokens ({self.patchify.max_tokens} patches at "
                f"the highest resolution {self.patchify.resolution[1]} px, {self.prefix_tokens} prefix); pass >= {need}"
            )
        if self.sequences < 1:
            raise ConfigError(f"packed sequences per batch: must be >= 1, got {self.sequences}")

    @property
    def padding_fraction(self) -> float:
        return self.padded / self.slots if self.slots else 0.0

    @property
    def num_images(self) -> int:
        """Images of the epoch (how many batches they make depends on their sizes: no ``len``)."""
        return len(self.source) if isinstance(self.source, ShardSet) else len(self.source.labels)

    def __iter__(self) -> Iterator[PackedBatch]:
        samples = self._shard_samples() if isinstance(self.source, ShardSet) else self._folder_samples()
        kw = {"pack_len": self.pack_len, "sequences": self.sequences, "prefix_tokens": self.prefix_tokens}
        self.slots = self.padded = 0
        for batch in pack_batches(samples, **kw):
            self.slots += batch.packed.image_ids.numel()
            self.padded += int((batch.packed.image_ids < 0).sum())
            yield batch

    def _loader(self, dataset: Any, **kw: Any) -> DataLoader:
        return DataLoader(dataset, batch_size=self.chunk, num_workers=self.workers, collate_fn=_as_list, **kw)

    def _folder_samples(self) -> Iterator[PackSample]:
        n = len(self.source.labels)
        order = EpochOrder([n], seed=self.seed, epoch=self.epoch, window=max(1, n), shuffle=self.shuffle)
        ds = _FolderPatches(self.source.images, self.source.labels, patchify=self.patchify, order=order)
        for chunk in self._loader(ds, sampler=range(min(self.start, n), n)):
            yield from chunk

    def _shard_samples(self) -> Iterator[PackSample]:
        if self.num_classes is None:
            raise ConfigError("PackedLoader over shards: pass num_classes")
        ds = ShardStream(
            shards=self.source,
            transform=ShardPatchify(patchify=self.patchify),
            out_shape=(0,),
            num_classes=self.num_classes,
            seed=self.seed,
            epoch=self.epoch,
            shuffle=self.shuffle,
            start=self.start,
            batch=self.chunk,
            label_map=self.label_map,
        )
        for chunk in self._loader(ds):
            for tokens, label, _key, position, error in chunk:
                if error:
                    raise DataError(error)
                yield PackSample(tokens, int(label), int(position))
