"""Training and evaluation straight from tar shards: one global sample order per epoch, read in DataLoader workers
and decoded there at full resolution (the decode cache is never used).

The order (:class:`EpochOrder`) is arithmetic over the shards' sample counts, so it is one sequence of the epoch's
samples whatever the number of processes and workers: the shards are permuted (seeded by seed and epoch), their
samples concatenated into a stream, and the stream shuffled within consecutive windows of ``window`` samples (the
bounded shuffle buffer; ``vitlab data pack`` has already shuffled the samples across shards). Position ``p`` of
the order goes to rank ``p mod world``; a rank's micro-batches go round-robin to its workers, which the DataLoader
reads in turn, so every optimizer step consumes the next ``batch_size`` positions of the order. A run that has
consumed ``c`` samples of an epoch resumes at position ``c`` with any number of processes or workers: no sample
of the epoch is seen twice or skipped. The epoch ends at the last whole optimizer step, so every rank gets the
same number of batches.

Memory: each worker holds the encoded samples it owns in one window (``window / (world * workers)`` on average)
and one tar member being read; nothing grows with the data set. Each worker reads the headers of every shard of
the epoch (local shards: a seek skips the members it does not own; URLs: streamed through).

Augmentation: each sample's random crop and flips are drawn from a generator seeded by (seed, epoch, position),
so a sample gets the same augmentation whichever process decodes it. With the storage a run chose for the shards
(:class:`KeptDecode`, the rule a folder is stored by), each sample is decoded as the decode cache stores a folder's
file (its shorter side at most the storage's) and cropped from that, the same pixels as the folder's; a run whose
samples are decoded in its own process (no DataLoader workers) keeps them decoded, up to :data:`KEEP_BYTES`, so that
later epochs crop without decoding, as a folder's run reads its decode cache. Without a storage (:class:`TrainDecode`)
RandomResizedCrop's box is drawn on the original image; a JPEG is decoded at the smallest DCT scale that keeps the
box at least the input size (:func:`~vitlab.data.images.decode.decode_encoded`). The evaluation split's batches are
kept after the first evaluation, up to :data:`KEEP_BYTES` (:class:`KeptBatches`): its transform has no randomness.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ...errors import DataError
from ..images.decode import decode_encoded, image_size, match_channels, typical_side
from ..images.storage import FolderStorage
from ..pipeline.loading import batches
from ..pipeline.seeding import item_seed, seeded
from ..sources import describe_splits
from .source import ShardSet, ShardSource, image_and_label, is_shard_spec, iter_samples, open_shard, open_source

__all__ = [
    "DEFAULT_SHUFFLE_BUFFER",
    "KEEP_BYTES",
    "STATS_SAMPLES",
    "TRACE_ENV",
    "EpochOrder",
    "EvalDecode",
    "KeptBatches",
    "KeptDecode",
    "ShardStream",
    "StreamBatches",
    "StreamData",
    "TrainDecode",
    "first_encoded",
    "first_images",
    "is_shard_spec",
    "open_stream_data",
]

DEFAULT_SHUFFLE_BUFFER = 8192
"""Samples in one shuffle window (timm's ``WDS_SHUFFLE_SIZE`` default is the same number, per worker)."""
STATS_SAMPLES = 512
"""The first training samples of a shard run whose pixels give its input statistics (:func:`first_images`), as a
folder run's come from its training images (:func:`~vitlab.data.pipeline.transforms.channel_stats`)."""
KEEP_BYTES = 1 << 30
"""The most bytes of decoded training samples (:class:`KeptDecode`), and of evaluation batches (:class:`KeptBatches`),
a shard run keeps in memory: a few thousand photos at the sides a CPU trains at (3,068 photos stored for 64 px take
21 MB); a larger split is decoded again each epoch beyond what fits."""
TRACE_ENV = "VITLAB_STREAM_TRACE"
"""A file to which the training process appends ``rank, epoch, position, key`` of each sample it trains on (tests)."""


def _rng(*ints: int) -> np.random.Generator:
    return np.random.default_rng([int(i) % (1 << 63) for i in ints])


class EpochOrder:
    """Epoch ``epoch``'s order of the samples of shards with ``counts`` samples: position -> stream offset ->
    (shard, index in the shard). ``shuffle=False``: the shards' own order (evaluation)."""

    def __init__(self, counts: Iterable[int], *, seed: int, epoch: int, window: int, shuffle: bool = True) -> None:
        c = np.asarray(list(counts), dtype=np.int64)
        self.n = int(c.sum())
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle
        self.window = max(1, window)  # without shuffle the windows are in order: they only bound the memory
        self.shard_order = _rng(seed, epoch, 0).permutation(len(c)) if shuffle else np.arange(len(c))
        self.starts = np.concatenate([[0], np.cumsum(c[self.shard_order])])
        self._perms: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _perm(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w``'s permutation and its inverse (the last two windows asked for are kept)."""
        if w not in self._perms:
            size = min(self.window, self.n - w * self.window)
            perm = _rng(self.seed, self.epoch, 1, w).permutation(size) if self.shuffle else np.arange(size)
            inv = np.empty_like(perm)
            inv[perm] = np.arange(size)
            if len(self._perms) >= 2:
                self._perms.pop(next(iter(self._perms)))
            self._perms[w] = (perm, inv)
        return self._perms[w]

    def offsets(self, positions: np.ndarray) -> np.ndarray:
        """The stream offsets of ``positions`` (all in one window)."""
        w = int(positions[0]) // self.window
        return w * self.window + self._perm(w)[0][positions - w * self.window]

    def position(self, offset: int) -> int:
        w = offset // self.window
        return w * self.window + int(self._perm(w)[1][offset - w * self.window])

    def locate(self, offset: int) -> tuple[int, int]:
        """``(slot, index)``: the offset's shard as the ``slot``-th of the epoch's shard order, and its sample."""
        slot = int(np.searchsorted(self.starts, offset, side="right")) - 1
        return slot, offset - int(self.starts[slot])


@dataclass(kw_only=True)
class ShardStream(IterableDataset):
    """Positions ``start:stop`` of one epoch's order that belong to ``rank`` of ``world``, as
    ``(image, label, key, position, error)`` samples; ``batch`` is the DataLoader's batch size (a rank's
    micro-batches are dealt to its workers in turn). ``error`` is "" or why the sample could not be used
    (:class:`StreamBatches` raises it in the training process)."""

    shards: ShardSet
    transform: Callable[[bytes], torch.Tensor]
    out_shape: tuple[int, ...]
    num_classes: int
    seed: int = 0
    epoch: int = 0
    window: int = DEFAULT_SHUFFLE_BUFFER
    shuffle: bool = True
    start: int = 0
    stop: int | None = None
    rank: int = 0
    world: int = 1
    batch: int = 1
    label_map: np.ndarray | None = None
    """Class index in the shards -> the model's (-1: a class the model does not know)."""

    def __len__(self) -> int:
        stop = len(self.shards) if self.stop is None else min(self.stop, len(self.shards))
        return len(range(self.start + self.rank, stop, self.world))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, str, int, str]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = EpochOrder(
            self.shards.counts, seed=self.seed, epoch=self.epoch, window=self.window, shuffle=self.shuffle
        )
        stop = order.n if self.stop is None else min(self.stop, order.n)
        n_local = len(self)

        def owned(lo: int, hi: int) -> np.ndarray:
            base = self.start + self.rank
            i = np.arange(max(0, -(-(lo - base) // self.world)), min(n_local, -(-(hi - base) // self.world)))
            return base + self.world * i[(i // self.batch) % workers == worker]

        def owns(offset: int) -> bool:
            p = order.position(offset)
            i, r = divmod(p - self.start - self.rank, self.world)
            return r == 0 and 0 <= i < n_local and (i // self.batch) % workers == worker

        reader = _Cursor(self.shards, order, owns)
        try:
            for lo in range(self.start - self.start % order.window, stop, order.window):
                pos = owned(lo, min(lo + order.window, stop))
                if not len(pos):
                    continue
                offs = order.offsets(pos)
                got = {int(o): reader.get(int(o)) for o in np.sort(offs)}
                for p, o in zip(pos.tolist(), offs.tolist(), strict=True):
                    yield self._item(p, *got.pop(o))
        finally:
            reader.close()

    def _item(self, p: int, url: str, key: str, parts: dict[str, bytes]) -> tuple[torch.Tensor, int, str, int, str]:
        try:
            image, label = image_and_label(parts, where=f"{url}: {key}")
            if self.label_map is not None:
                label = int(self.label_map[label]) if 0 <= label < len(self.label_map) else -1
            if not 0 <= label < self.num_classes:
                raise DataError(f"{url}: {key}: class index {label} is not one of the {self.num_classes} classes")
            if self.shuffle:  # the same augmentation whichever process decodes the sample, wherever the run resumed
                with seeded(item_seed(self.seed, self.epoch, p)):
                    x = self.transform(image)
            else:
                x = self.transform(image)
            return x, label, key, p, ""
        except Exception as e:
            why = e if isinstance(e, DataError) else f"{url}: {key}: cannot decode ({type(e).__name__}: {e})"
            return torch.zeros(self.out_shape), 0, key, p, str(why)


_BROKEN = "the shard is truncated, damaged or was removed; restore it (or re-pack the data for a new run) and --resume"


class _Cursor:
    """Reads a window's owned samples in stream order, forward through the epoch's shards."""

    def __init__(self, shards: ShardSet, order: EpochOrder, owns: Callable[[int], bool]) -> None:
        self.shards, self.order, self.owns = shards, order, owns
        self.slot, self.next_index, self.tar, self.it = -1, 0, None, None

    def get(self, offset: int) -> tuple[str, str, dict[str, bytes]]:
        """``(url, key, members)`` of the sample at stream offset ``offset``; a shard that cannot be read (truncated,
        damaged, removed while the run reads it) is a one-line :class:`DataError` naming it."""
        slot, index = self.order.locate(offset)
        url = self.shards.shards[int(self.order.shard_order[slot])].url
        try:
            return self._get(slot, index, url)
        except (OSError, EOFError, tarfile.TarError) as e:
            self.close()
            raise DataError(f"{url}: cannot read sample {index} ({type(e).__name__}: {e}): {_BROKEN}") from None
        except DataError as e:  # the reader's own checks (a miscounted shard, an oversized member): what to do next
            self.close()
            raise DataError(f"{e}; restore the shard (or re-pack the data for a new run) and --resume") from None

    def _get(self, slot: int, index: int, url: str) -> tuple[str, str, dict[str, bytes]]:
        if slot != self.slot or index < self.next_index:
            self.close()
            self.slot, self.next_index = slot, 0
            shard = self.shards.shards[int(self.order.shard_order[slot])]
            self.tar = open_shard(shard.url)
            start, count = int(self.order.starts[slot]), shard.samples
            self.it = iter_samples(self.tar, lambda i: i < count and self.owns(start + i), count=count, where=shard.url)
        for i, key, parts in self.it:
            self.next_index = i + 1
            if i == index:
                if parts is None:
                    raise DataError(f"{url}: sample {i} was skipped by the reader (inconsistent ownership)")
                return url, key, parts
        n = self.shards.shards[int(self.order.shard_order[slot])].samples
        raise DataError(f"{url}: fewer samples than the {n:,} the manifest (or a first reading) counted: {_BROKEN}")

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
        self.tar = self.it = None


class TrainDecode:
    """Bytes -> the training input: RandomResizedCrop drawn on the original image (decoded no smaller than the
    crop needs), resized to ``img_size`` (bilinear, antialiased, as torchvision's), then ``rest`` (flip,
    RandAugment, normalisation, random erasing: :func:`~vitlab.data.pipeline.transforms.train_transform` without its
    crop)."""

    def __init__(self, *, img_size, crop_scale, crop_ratio, in_chans: int, rest: Callable) -> None:
        self.size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.scale, self.ratio, self.in_chans, self.rest = tuple(crop_scale), tuple(crop_ratio), in_chans, rest

    def _box(self, w: int, h: int) -> tuple[int, int, int, int]:
        from torchvision.transforms import RandomResizedCrop

        top, left, bh, bw = RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(1, h, w), self.scale, self.ratio)
        return left, top, left + bw, top + bh

    def __call__(self, data: bytes) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        arr = decode_encoded(data, region=self._box, at_least=self.size[::-1], jpeg_turbo=True)
        x = torch.from_numpy(arr if arr.flags.writeable else arr.copy()).permute(2, 0, 1)
        x = TF.resize(x, list(self.size), antialias=True)
        return self.rest(match_channels(x, self.in_chans))


class KeptDecode:
    """Bytes -> the training input as a folder's run makes it: the sample decoded as the decode cache stores a file
    (its shorter side at most ``store_side``, aspect ratio and whole extent kept:
    :func:`~vitlab.data.images.decode.decode_encoded`), then ``tf`` (the folder's
    :func:`~vitlab.data.pipeline.transforms.train_transform`, its random crop included). Decoded samples are kept in
    this process, keyed by a hash of their bytes, up to ``keep_bytes`` (0: none), so that a sample seen again is only
    cropped; a DataLoader worker's copy lives for one epoch, so a run with workers keeps none."""

    def __init__(self, *, store_side: int, in_chans: int, tf: Callable, keep_bytes: int = KEEP_BYTES) -> None:
        self.store_side, self.in_chans, self.tf, self.keep_bytes = store_side, in_chans, tf, keep_bytes
        self._kept: dict[bytes, np.ndarray] = {}
        self._bytes = 0

    def __call__(self, data: bytes) -> torch.Tensor:
        key = hashlib.blake2b(data, digest_size=16).digest()
        arr = self._kept.get(key)
        if arr is None:
            arr = decode_encoded(data, shorter_side=self.store_side)
            if self._bytes + arr.nbytes <= self.keep_bytes:
                self._kept[key] = arr
                self._bytes += arr.nbytes
        x = torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1)
        return self.tf(match_channels(x, self.in_chans))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_kept": {}, "_bytes": 0}  # a worker's copy starts empty


class KeptBatches:
    """The batches of ``loader`` (an evaluation split's: no randomness), read from it the first time and kept, up to
    ``keep_bytes``, so that later evaluations replay them without decoding (the same tensors); a split over the limit
    is read again each time. A pass that fails keeps nothing."""

    def __init__(self, loader: Iterable, *, keep_bytes: int = KEEP_BYTES) -> None:
        self.loader, self.keep_bytes = loader, keep_bytes
        self._kept: list | None = None

    def __len__(self) -> int:
        return len(self._kept) if self._kept is not None else len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._kept is not None:
            yield from self._kept
            return
        kept: list | None = []
        size = 0
        for batch in self.loader:
            if kept is not None:
                size += sum(t.nbytes for t in batch if isinstance(t, torch.Tensor))
                if size <= self.keep_bytes:
                    kept.append(batch)
                else:
                    kept = None
            yield batch
        self._kept = kept


class EvalDecode:
    """Bytes -> the evaluation input: decoded, then ``tf``. At full scale by default, as PIL opens the file for
    ``vitlab eval`` on a folder and for timm's transform (the same pixels); ``at_least`` ``(width, height)``
    lets a JPEG be decoded at a reduced DCT scale that keeps it at least that large (faster for large photos,
    other pixels)."""

    def __init__(self, *, in_chans: int, tf: Callable, at_least: tuple[int, int] | None = None) -> None:
        self.at_least, self.in_chans, self.tf = at_least, in_chans, tf

    def __call__(self, data: bytes) -> torch.Tensor:
        x = torch.from_numpy(np.array(decode_encoded(data, at_least=self.at_least))).permute(2, 0, 1)
        return self.tf(match_channels(x, self.in_chans))


class StreamBatches:
    """``(images, labels)`` batches of a :class:`ShardStream`'s DataLoader (iterable again, for each evaluation);
    a sample that could not be used is a one-line :class:`DataError` here. ``trace``: with ``$VITLAB_STREAM_TRACE``
    set, each batch's samples are appended to that file as the batch is handed on (so a batch that the loop never
    took is not listed)."""

    def __init__(self, loader: Iterable, *, rank: int = 0, epoch: int = 0, trace: bool = False) -> None:
        self.loader, self.rank, self.epoch = loader, rank, epoch
        self.trace = os.environ.get(TRACE_ENV) if trace else None

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y, keys, pos, errors in batches(self.loader):  # a worker's failure: one line, workers ended
            bad = next((e for e in errors if e), None)
            if bad:
                raise DataError(bad)
            if self.trace:
                rows = (f"{self.rank}\t{self.epoch}\t{int(p)}\t{k}\n" for p, k in zip(pos, keys, strict=True))
                with open(self.trace, "a", encoding="utf-8") as f:
                    f.write("".join(rows))
            yield x, y


@dataclass(kw_only=True)
class StreamData:
    """A shard source as the trainer sees a :class:`~vitlab.data.sources.DataSplits`: lengths, classes, the sizes of
    the first samples (``sizes``: ``(width, height) -> count``, from their headers) and their typical side; the
    images stay in the shards. ``storage``: the side a run chose for them (the rule folders are stored by,
    :func:`vitlab.train.sizing.side.folder_storage`; None: the typical side, evaluated whole)."""

    source: ShardSource
    sizes: dict[tuple[int, int], int]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    cache_files: list[Path] = field(default_factory=list)
    in_chans: int = 3
    storage: FolderStorage | None = None

    @property
    def image_size(self) -> tuple[int, int]:
        """The resolution to train at: the storage's, else the typical side of the first samples, square."""
        if self.storage is not None and self.storage.size is not None:
            return self.storage.size
        side = typical_side(self.sizes)
        return side, side

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def train(self) -> ShardSet:
        return self.source.train

    @property
    def val(self) -> ShardSet:
        return self.source.val

    @property
    def val_name(self) -> str:
        return self.source.val_name

    @property
    def class_names(self) -> list[str]:
        return self.source.classes

    @property
    def num_classes(self) -> int:
        return len(self.source.classes)

    def describe(self) -> dict[str, object]:
        shards = {"train": len(self.train.shards), self.val_name: len(self.val.shards)}
        return {**describe_splits(self), "shards": shards}


def first_encoded(shards: ShardSet) -> Iterator[bytes]:
    """The encoded images of ``shards``' samples in their stored order, each read from its shard as training reads
    it; a sample without an image, or the rest of a shard that cannot be read, is passed over (training reports it,
    with what to do). Lazy, one shard open at a time: a caller reads as many as it takes (close the iterator, or let
    it go, to close the shard)."""
    for shard in shards.shards:
        try:
            with open_shard(shard.url) as tar:
                for i, _, parts in iter_samples(tar, lambda i: True, where=shard.url):
                    if parts is None:
                        continue
                    try:
                        img, _ = image_and_label(parts, where=f"{shard.url}: sample {i}")
                    except Exception:  # any failure: the caller does without this sample
                        continue
                    yield img
        except (DataError, OSError, tarfile.TarError):  # a damaged or missing shard: training's reader says so
            continue


def first_images(shards: ShardSet, n: int = STATS_SAMPLES, *, at_least: tuple[int, int] | None = None) -> list:
    """The first ``n`` images of ``shards`` in their stored order (fewer when they hold fewer,
    :func:`first_encoded`), decoded as uint8 ``(H, W, 3)`` arrays (a JPEG at the smallest DCT scale keeping
    ``at_least`` ``(width, height)``); a sample that does not decode is passed over. Bounded: samples are read until
    ``n`` decode."""
    images: list[np.ndarray] = []
    with contextlib.closing(first_encoded(shards)) as encoded:
        for img in encoded:
            try:
                images.append(np.asarray(decode_encoded(img, at_least=at_least)))
            except Exception:  # any decoding failure: the statistics do without this sample
                continue
            if len(images) >= n:
                break
    return images


def open_stream_data(
    spec: str, *, val_split: float | None = None, eval_only: bool = False, allow_pipe: bool = False
) -> StreamData:
    """``--data spec`` (:func:`is_shard_spec`) resolved to its shards, with the sizes of the first shard's first
    samples (read from their headers): a run chooses its side from them as from a folder's headers. ``allow_pipe``: as
    :func:`~vitlab.data.shards.source.open_source` takes it (only for a value typed with ``--allow-pipe``)."""
    src = open_source(spec, val_split=val_split, eval_only=eval_only, allow_pipe=allow_pipe)
    first = (src.val if eval_only else src.train).shards
    if not first:
        raise DataError(f"--data {spec}: no samples in the {'evaluation' if eval_only else 'training'} split")
    sizes: dict[tuple[int, int], int] = {}
    with open_shard(first[0].url) as tar:
        for i, _, parts in iter_samples(tar, lambda i: i < 16, where=first[0].url):
            if parts is None:
                break
            img, _ = image_and_label(parts, where=f"{first[0].url}: sample {i}")
            wh = image_size(io.BytesIO(img))
            if wh is not None:
                sizes[wh] = sizes.get(wh, 0) + 1
    if not sizes:
        raise DataError(f"{first[0].url}: none of its first samples is a readable image")
    return StreamData(source=src, sizes=sizes)
