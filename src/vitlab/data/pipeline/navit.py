"""Images at their own aspect ratio, packed into sequences (NaViT: Dehghani et al. 2023, "Patch n' Pack").

Each image of an epoch goes through four steps:

1. **a resolution**: the side ``R`` of a square of the image's area, drawn uniformly in ``resolution`` (NaViT's
   variable resolution, Sec. 3.2; one value for evaluation), gives a token budget ``floor((R / P)^2)``;
2. **its grid**: a random crop at the image's own aspect ratio (training: a share of its area in ``crop_scale``,
   its aspect ratio times a factor in ``crop_ratio``), then the largest patch grid of that shape within the
   budget (:func:`native_grid`); the crop is resized to it (the evaluation's bicubic resize,
   :func:`vitlab.data.pipeline.transforms.resize_image`), flipped or augmented, normalised (the loaders normalise a
   whole packed batch at once, :meth:`Patchify.normalise_packed`: the same kernels, the same values);
3. **its patches** (:func:`~vitlab.models.packed.patchify`), of which token dropping keeps a random subset
   (NaViT Sec. 3.4, :func:`~vitlab.models.packed.drop_tokens`; ``SequenceBatches.token_drop``);
4. **packing**, one of two ways. ``sequences``: images in the epoch's order fill a batch of ``sequences``
   sequences of ``pack_len`` tokens, each image taking its patches plus the model's prefix tokens in the first
   sequence with room for it (first fit); the first image that fits in none closes the batch and opens the next
   one (NaViT's fixed token budget per batch). ``images``: every ``images`` images of the order make a batch, laid
   largest first into as many sequences of ``pack_len`` tokens as they need (first fit decreasing): a fixed
   number of images per batch, as square training has (what ``vitlab train --pack`` uses: its epochs, schedule and
   resumption stay those of square training, on any number of processes).

Steps 1-3 run in DataLoader workers (when ``workers > 0``); each image's random draws come from a generator
seeded by (seed, epoch, position), so they do not depend on the process that makes them. Token dropping and
packing run in the training process, in order (so that the drop rate can change from one batch to the next).

**Position.** A batch holds a contiguous run of the epoch's order: its :attr:`PackedBatch.next_position` is the
number of images of the epoch consumed once it is trained on, the one integer a checkpoint stores to resume.
Starting an epoch's loader at that position (``start=``) gives exactly the batches that would have followed.
With ``rank`` and ``world``, process ``rank`` takes positions ``start + rank``, ``start + rank + world``, ... of
the order (each process a disjoint share, every image of ``start:stop`` once); with ``images``, batch ``k`` of
every process then ends at position ``start + (k + 1) x images x world``.

Sources: a decoded split (``vitlab.data.load_data``'s images, stored at their aspect ratio) read in a seeded
permutation, or tar shards through :class:`~vitlab.data.shards.stream.ShardStream` (its order, decoded in its workers).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ...errors import ConfigError, DataError
from ...models.packed import PackedPatches, PatchTokens, drop_tokens, patchify
from ..images.decode import decode_encoded, match_channels
from ..shards.source import ShardSet
from ..shards.stream import DEFAULT_SHUFFLE_BUFFER, KEEP_BYTES, EpochOrder, ShardStream
from .first_fit import PackedBatch, PackSample, pack_batches, pack_groups
from .loading import workers_share_temp_dir
from .seeding import item_seed, seeded
from .transforms import _normalize, resize_image

__all__ = [
    "KeptBytes",
    "PackSample",
    "PackedBatch",
    "Patchify",
    "SequenceBatches",
    "ShardPatchify",
    "SizedImages",
    "native_grid",
    "pack_batches",
    "pack_groups",
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
    """A decoded image (uint8 ``(H, W, C)``) -> its :class:`~vitlab.models.packed.PatchTokens` (steps 1-3 above,
    without the token dropping).

    ``resolution``: ``(low, high)`` side of the area-equivalent square in pixels, drawn uniformly per image
    (``(s, s)``: every image at the token budget of an ``s`` x ``s`` image). ``crop_scale``: the share of the
    image's area a random crop keeps, drawn uniformly in it; ``crop_ratio``: the crop's aspect ratio relative to
    the image's, drawn log-uniformly in it (``(1, 1)`` both: the whole image, no draw). ``hflip``: probability of
    a horizontal flip; ``augment``: uint8 ``(C, H, W)`` -> same, applied at the packed size (RandAugment ...).
    Random draws use torch's global generator (seeded per sample by the loaders)."""

    patch_size: int
    resolution: tuple[float, float]
    mean: Sequence[float]
    std: Sequence[float]
    in_chans: int = 3
    crop_scale: tuple[float, float] = (1.0, 1.0)
    crop_ratio: tuple[float, float] = (1.0, 1.0)
    hflip: float = 0.0
    augment: Callable[[torch.Tensor], torch.Tensor] | None = None
    _norm: v2.Compose = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lo, hi = self.resolution
        if not 0 < lo <= hi:
            raise ConfigError(f"resolution: expected 0 < low <= high, got {lo}, {hi}")
        (a, b), (r, q) = self.crop_scale, self.crop_ratio
        if not (0 < a <= b <= 1 and 0 < r <= q):
            raise ConfigError(f"crop: scale within (0, 1] and ratio > 0, low <= high; got {a}, {b} and {r}, {q}")
        object.__setattr__(self, "_norm", v2.Compose(_normalize(self.mean, self.std, self.in_chans)))

    @property
    def max_tokens(self) -> int:
        """The most patches an image can have (at the high resolution)."""
        return token_budget(self.resolution[1], self.patch_size)

    @property
    def fixed_size(self) -> bool:
        """Whether :meth:`sized` draws nothing (one resolution, no random crop): an image's packed size and
        pixels are then the same in every epoch, and :class:`SizedImages` may keep them."""
        return self.resolution[0] == self.resolution[1] and self.crop_scale == self.crop_ratio == (1.0, 1.0)

    def __call__(self, image: np.ndarray | torch.Tensor) -> PatchTokens:
        return self.finish(self.sized(image))

    def sized(self, image: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Steps 1-2 up to the resize: ``image`` (uint8 ``(H, W, C)`` array or ``(C, H, W)`` tensor) at its
        drawn resolution and crop, resized to its patch grid, ``(C, gh * P, gw * P)``."""
        x = image if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image, copy=True))
        if not isinstance(image, torch.Tensor):
            x = x.permute(2, 0, 1)
        x = match_channels(x, self.in_chans)
        lo, hi = self.resolution
        side = lo + (hi - lo) * float(torch.rand(())) if hi > lo else float(lo)
        x = self._crop(x)
        p = self.patch_size
        gh, gw = native_grid(x.shape[1], x.shape[2], patch_size=p, max_tokens=token_budget(side, p))
        if (x.shape[1], x.shape[2]) != (gh * p, gw * p):
            x = resize_image(x, (gh * p, gw * p))
        return x

    def finish(self, x: torch.Tensor, *, normalise: bool = True) -> PatchTokens:
        """The rest of step 2 and step 3 on a :meth:`sized` image (left unchanged): flip, augment, normalise,
        patch. ``normalise=False``: the patches keep the image's uint8 values, for a loader that normalises a packed
        batch at once (:meth:`normalise_packed`)."""
        if self.hflip > 0 and float(torch.rand(())) < self.hflip:
            x = x.flip(-1)
        if self.augment is not None:
            x = self.augment(x)
        return patchify(self._norm(x) if normalise else x, self.patch_size)

    def normalise_packed(self, packed: PackedPatches) -> PackedPatches:
        """``packed`` built from ``finish(..., normalise=False)`` tokens, its patch values normalised as
        :meth:`finish` normalises an image's (the same two torchvision kernels, elementwise: the same values), in
        one call a batch instead of one an image (on a CPU the per-image call was a fifth of an image's loading:
        docs/training.md, "Packing"); prefix slots and padding stay zero."""
        x = packed.patches
        b, s, k = x.shape
        c = self.in_chans
        x = self._norm(x.reshape(b * s, c, k // c, 1)).reshape(b, s, k)  # a patch's values: C planes of P x P
        return dataclasses.replace(packed, patches=torch.where((packed.rows >= 0)[..., None], x, 0.0))

    def _crop(self, x: torch.Tensor) -> torch.Tensor:
        """A random box of ``x`` ``(C, H, W)`` at its own aspect ratio (times the drawn factor), or ``x``."""
        if self.crop_scale == (1.0, 1.0) and self.crop_ratio == (1.0, 1.0):
            return x
        h, w = x.shape[1:]
        u = torch.rand(4).tolist()
        area = self.crop_scale[0] + (self.crop_scale[1] - self.crop_scale[0]) * u[0]
        lr, hr = math.log(self.crop_ratio[0]), math.log(self.crop_ratio[1])
        ratio = math.exp(lr + (hr - lr) * u[1])  # the box's width/height over the image's
        bh = max(1, min(h, round(h * math.sqrt(area / ratio))))
        bw = max(1, min(w, round(w * math.sqrt(area * ratio))))
        top, left = int(u[2] * (h - bh + 1)), int(u[3] * (w - bw + 1))
        return x[:, top : top + bh, left : left + bw]


@dataclass(frozen=True, kw_only=True)
class ShardPatchify:
    """The bytes of a tar shard's image -> :class:`Patchify`'s tokens (decoded at full resolution)."""

    patchify: Patchify
    normalise: bool = True
    """False: uint8 patches, for :meth:`Patchify.normalise_packed` once the batch is packed."""

    def __call__(self, data: bytes) -> PatchTokens:
        return self.patchify.finish(self.patchify.sized(decode_encoded(data)), normalise=self.normalise)


@dataclass
class KeptBytes:
    """What a process may still keep in memory, in bytes: one cap shared by the :class:`SizedImages` that draw on
    it (a packed run's training split and its native evaluation's)."""

    left: int


class SizedImages:
    """The images of a decoded split through :meth:`Patchify.sized`. With a fixed geometry
    (:attr:`Patchify.fixed_size`) each resized image is kept in this process, up to ``keep_bytes`` in all (the
    shards' :data:`~vitlab.data.shards.stream.KEEP_BYTES` by default; 0: none; a :class:`KeptBytes`: what is left of
    a cap shared with another split), and read again in the next epochs instead of resized anew: the bicubic resize
    was two fifths of a packed step's loading on a CPU (docs/training.md, "Packing"). The same pixels either way
    (nothing is drawn before the resize). A DataLoader worker's copy lives for one epoch, so a run with workers
    keeps none. :attr:`keeps`: whether the first pass keeps what the next ones read (its steps cost more: the time
    budget's ``first_epoch_fills``)."""

    def __init__(self, images: Any, patchify: Patchify, *, keep_bytes: int | KeptBytes = KEEP_BYTES) -> None:
        self.images, self.patchify = images, patchify
        self.budget = keep_bytes if isinstance(keep_bytes, KeptBytes) else KeptBytes(keep_bytes)
        self.keeps = patchify.fixed_size and self.budget.left > 0
        self.kept: dict[int, torch.Tensor] = {}

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.kept.get(i)
        if x is None:
            x = self.patchify.sized(self.images[i])
            size = x.numel() * x.element_size()
            if self.keeps and size <= self.budget.left:
                self.kept[i] = x
                self.budget.left -= size
        return x

    def __getstate__(self) -> dict:
        return {**self.__dict__, "kept": {}, "budget": KeptBytes(0), "keeps": False}  # a worker's copy keeps nothing


class _FolderPatches(Dataset):
    """Position ``p`` of an epoch's order of decoded images -> :class:`PackSample` (in DataLoader workers)."""

    def __init__(self, images: SizedImages, labels: np.ndarray, *, order: EpochOrder) -> None:
        self.images, self.labels, self.order = images, labels, order

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, p: int) -> PackSample:
        i = int(self.order.offsets(np.asarray([p]))[0])
        finish = self.images.patchify.finish  # uint8 patches: SequenceBatches normalises each packed batch
        if self.order.shuffle:  # the same draws whichever worker prepares it, and again after a resumption
            with seeded(item_seed(self.order.seed, self.order.epoch, p)):
                tokens = finish(self.images[i], normalise=False)
        else:
            tokens = finish(self.images[i], normalise=False)
        return PackSample(tokens, int(self.labels[i]), p)


def _as_list(items: list) -> list:
    return items


_DROP = -(1 << 40)
"""Token dropping's seeds: ``item_seed(seed, epoch, _DROP - position)``, apart from the augmentation's."""


@dataclass(kw_only=True)
class SequenceBatches:
    """One epoch of :class:`PackedBatch` from ``source``: a decoded split (an object with ``images`` and
    ``labels``, as ``load_data`` returns) or tar shards (a :class:`~vitlab.data.shards.source.ShardSet`).

    Batches of ``sequences`` sequences, or of ``images`` images (exactly one of the two; see the module's notes).
    ``shuffle``: a seeded permutation of the epoch (training) with per-image random draws; else the source's own
    order without them (evaluation). ``start``: the position to resume at (a batch's ``next_position``);
    ``stop``: the position to end before (default: the epoch's end); ``rank`` of ``world``: this process's share.
    ``token_drop``: the share of each image's patches dropped as it is packed, read then (it may change between
    batches), each image's draw seeded by (seed, epoch, position). ``prefix_tokens``: the model's
    ``num_prefix_tokens``. ``chunk``: images per DataLoader batch of the workers; ``worker_init_fn`` and
    ``generator`` are the DataLoader's (default: a generator of (seed, epoch, rank), so that no global generator
    is drawn from). ``num_classes``, ``label_map`` (class index in the shards -> the model's) and ``window`` (the
    shuffle window) for shards. ``sized``: the decoded split's :class:`SizedImages` kept across epochs (by
    ``patchify``; default: resized anew). :attr:`padding_fraction` is the padding of the batches yielded so far in the
    current pass, :attr:`slots` and :attr:`padded` its counts."""

    source: Any
    patchify: Patchify
    pack_len: int
    prefix_tokens: int
    sequences: int | None = None
    images: int | None = None
    seed: int = 0
    epoch: int = 0
    start: int = 0
    stop: int | None = None
    rank: int = 0
    world: int = 1
    shuffle: bool = True
    token_drop: float = 0.0
    workers: int = 0
    chunk: int = 32
    worker_init_fn: Callable[[int], None] | None = None
    generator: torch.Generator | None = None
    num_classes: int | None = None
    label_map: np.ndarray | None = None
    window: int = DEFAULT_SHUFFLE_BUFFER
    sized: SizedImages | None = None
    slots: int = field(default=0, init=False)
    padded: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        need = self.patchify.max_tokens + self.prefix_tokens
        if self.pack_len < need:
            raise ConfigError(
                f"--pack-len {self.pack_len}: an image may take {need} tokens ({self.patchify.max_tokens} patches at "
                f"the highest resolution {self.patchify.resolution[1]} px, {self.prefix_tokens} prefix); pass >= {need}"
            )
        if (self.sequences is None) == (self.images is None) or (self.sequences or self.images or 0) < 1:
            raise ConfigError(
                f"packed batches: give sequences or images per batch (one of them, >= 1), got {self.sequences}, "
                f"{self.images}"
            )
        if not 0 <= self.rank < self.world:
            raise ConfigError(f"packed loader: rank {self.rank} of {self.world} processes")
        if self.sized is not None and self.sized.patchify is not self.patchify:
            raise ConfigError("packed loader: the kept resized images were made by another Patchify")

    @property
    def padding_fraction(self) -> float:
        return self.padded / self.slots if self.slots else 0.0

    @property
    def num_images(self) -> int:
        """Images of the epoch (how many batches they make depends on their sizes: no ``len``)."""
        return len(self.source) if isinstance(self.source, ShardSet) else len(self.source.labels)

    def __iter__(self) -> Iterator[PackedBatch]:
        samples = self._shard_samples() if isinstance(self.source, ShardSet) else self._folder_samples()
        kw = {"pack_len": self.pack_len, "prefix_tokens": self.prefix_tokens}
        if self.images is not None:
            batches = pack_groups(self._dropped(samples), images=self.images, start=self.start, stride=self.world, **kw)
        else:
            batches = pack_batches(self._dropped(samples), sequences=self.sequences, **kw)  # type: ignore[arg-type]
        self.slots = self.padded = 0
        for batch in batches:
            self.slots += batch.packed.image_ids.numel()
            self.padded += int((batch.packed.image_ids < 0).sum())
            yield dataclasses.replace(batch, packed=self.patchify.normalise_packed(batch.packed))

    def _dropped(self, samples: Iterable[PackSample]) -> Iterator[PackSample]:
        for s in samples:
            if self.token_drop:
                g = torch.Generator().manual_seed(item_seed(self.seed, self.epoch, _DROP - s.position))
                s = PackSample(drop_tokens(s.tokens, self.token_drop, generator=g), s.label, s.position)
            yield s

    def _loader(self, dataset: Any, **kw: Any) -> DataLoader:
        if self.workers:
            workers_share_temp_dir()
        g = self.generator or torch.Generator().manual_seed(item_seed(self.seed, self.epoch, -1 - self.rank))
        return DataLoader(
            dataset, batch_size=self.chunk, num_workers=self.workers, collate_fn=_as_list, generator=g,
            worker_init_fn=self.worker_init_fn, **kw,
        )  # fmt: skip

    def _folder_samples(self) -> Iterator[PackSample]:
        n = len(self.source.labels)
        stop = n if self.stop is None else min(self.stop, n)
        order = EpochOrder([n], seed=self.seed, epoch=self.epoch, window=max(1, n), shuffle=self.shuffle)
        sized = self.sized or SizedImages(self.source.images, self.patchify, keep_bytes=0)
        ds = _FolderPatches(sized, self.source.labels, order=order)
        for chunk in self._loader(ds, sampler=range(self.start + self.rank, stop, self.world)):
            yield from chunk

    def _shard_samples(self) -> Iterator[PackSample]:
        if self.num_classes is None:
            raise ConfigError("SequenceBatches over shards: pass num_classes")
        ds = ShardStream(
            shards=self.source,
            transform=ShardPatchify(patchify=self.patchify, normalise=False),
            out_shape=(0,),
            num_classes=self.num_classes,
            seed=self.seed,
            epoch=self.epoch,
            window=self.window,
            shuffle=self.shuffle,
            start=self.start,
            stop=self.stop,
            rank=self.rank,
            world=self.world,
            batch=self.chunk,
            label_map=self.label_map,
        )
        for chunk in self._loader(ds):
            for tokens, label, _key, position, error in chunk:
                if error:
                    raise DataError(error)
                yield PackSample(tokens, int(label), int(position))
