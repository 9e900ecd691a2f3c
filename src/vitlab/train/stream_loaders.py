"""A run's loaders over tar shards (:mod:`vitlab.data.stream`): the epoch's global order from the sample the run
has consumed, this rank's share of it, and the evaluation split split over ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..data.transforms import resize_side
from ..errors import ConfigError
from .config import TrainConfig
from .distributed import Dist
from .loaders import Loaders, micro_batch
from .loop import ignore_stop_signals

if TYPE_CHECKING:
    from ..data.shard_source import ShardSet
    from ..data.stream import StreamBatches, StreamData
    from ..models import ViTConfig

__all__ = ["StreamLoaders", "build_stream_loaders"]


class _Head(Dataset):
    """The first samples of a split, read when first indexed and decoded per item, for ``--time-budget``'s probe
    (which times a few items); ``len()`` is the split's (this rank's share), as the probe scales by it."""

    def __init__(self, shards: ShardSet, transform: Callable, length: int, k: int = 32) -> None:
        self.shards, self.transform, self.length, self.k = shards, transform, length, k
        self.items: list[tuple[bytes, int]] = []

    @property
    def labels(self) -> np.ndarray:
        self._read()
        return np.asarray([y for _, y in self.items], dtype=np.int64)

    def _read(self) -> None:
        from ..data.shard_source import image_and_label, iter_samples, open_shard

        for sh in self.shards.shards:
            if len(self.items) >= self.k:
                break
            with open_shard(sh.url) as tar:
                for _, key, parts in iter_samples(tar, lambda i: True):
                    self.items.append(image_and_label(parts, where=f"{sh.url}: {key}"))
                    if len(self.items) >= self.k:
                        break

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not self.items:
            self._read()
        data, y = self.items[i % len(self.items)]
        return self.transform(data), y


@dataclass(kw_only=True)
class StreamLoaders(Loaders):
    """:class:`~vitlab.train.loaders.Loaders` over shards: :meth:`train_loader` starts epoch ``epoch`` at global
    sample ``start_micro x micro x world`` (the samples all ranks have consumed), so a run resumes exactly on any
    number of processes."""

    shards: ShardSet
    train_tf: Callable
    window: int
    dist: Dist
    num_classes: int
    out_shape: tuple[int, ...]

    def train_loader(self, epoch: int, start_micro: int = 0) -> StreamBatches:
        from ..data.stream import ShardStream, StreamBatches

        per_micro = self.micro * self.dist.world_size  # samples of one micro-batch, all ranks together
        ds = ShardStream(
            shards=self.shards,
            transform=self.train_tf,
            out_shape=self.out_shape,
            num_classes=self.num_classes,
            seed=self.seed,
            epoch=epoch,
            window=self.window,
            start=start_micro * per_micro,
            stop=self.micro_per_epoch * per_micro,
            rank=self.dist.rank,
            world=self.dist.world_size,
            batch=self.micro,
        )
        loader = DataLoader(
            ds,
            batch_size=self.micro,
            num_workers=self.workers,
            generator=self.epoch_generator(epoch),
            worker_init_fn=ignore_stop_signals,
        )
        return StreamBatches(loader, rank=self.dist.rank, epoch=epoch, trace=True)


def build_stream_loaders(
    cfg: TrainConfig,
    *,
    data: StreamData,
    model_config: ViTConfig,
    dist: Dist,
    device: torch.device,
    workers: int,
    eval_batch: int | None = None,
    labels: bool = True,
) -> StreamLoaders:
    """The training and evaluation loaders of shard data with the recipe's augmentation; one epoch is
    ``len(train) // batch_size`` optimizer steps on every rank."""
    from ..data import eval_transform, mix_transform, train_transform
    from ..data.stream import EvalDecode, ShardStream, StreamBatches, TrainDecode

    r, mcfg = cfg.recipe, model_config
    micro = micro_batch(r.batch_size, world_size=dist.world_size, accum_steps=r.accum_steps)
    steps_per_epoch = len(data.train) // r.batch_size
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {r.batch_size} is larger than the training set ({len(data.train)} images)")
    size = (mcfg.img_size, mcfg.img_size) if isinstance(mcfg.img_size, int) else tuple(mcfg.img_size)
    rest = train_transform(
        img_size=size,
        mean=mcfg.mean,
        std=mcfg.std,
        in_chans=mcfg.in_chans,
        hflip=r.hflip,
        randaugment=r.randaugment,
        random_erasing=r.random_erasing,
        crop=False,
    )
    train_tf = TrainDecode(
        img_size=size, crop_scale=r.crop_scale, crop_ratio=r.crop_ratio, in_chans=mcfg.in_chans, rest=rest
    )
    tf = eval_transform(img_size=size, mean=mcfg.mean, std=mcfg.std, in_chans=mcfg.in_chans, crop_pct=r.crop_pct)
    resize = [resize_side(s, r.crop_pct) for s in size]
    eval_tf = EvalDecode(at_least=(resize[1], resize[0]), in_chans=mcfg.in_chans, tf=tf)
    out_shape = (mcfg.in_chans, *size)
    eval_batch = eval_batch or max(micro, 256)
    val = ShardStream(
        shards=data.val,
        transform=eval_tf,
        out_shape=out_shape,
        num_classes=data.num_classes,
        shuffle=False,
        rank=dist.rank,
        world=dist.world_size,
        batch=eval_batch,
    )
    generator = torch.Generator().manual_seed(cfg.seed + 1000 * dist.rank)
    eval_loader = DataLoader(
        val, batch_size=eval_batch, num_workers=workers, generator=generator, worker_init_fn=ignore_stop_signals
    )
    return StreamLoaders(
        train_ds=_Head(data.train, train_tf, len(data.train) // dist.world_size),
        val_ds=_Head(data.val, eval_tf, len(val)),
        sampler=None,
        micro=micro,
        accum_steps=r.accum_steps,
        steps_per_epoch=steps_per_epoch,
        workers=workers,
        generator=generator,
        eval_loader=StreamBatches(eval_loader),
        mix=mix_transform(num_classes=data.num_classes, mixup=r.mixup, cutmix=r.cutmix) if labels else None,
        shards=data.train,
        train_tf=train_tf,
        seed=cfg.seed,
        rank=dist.rank,
        window=cfg.shuffle_buffer,
        dist=dist,
        num_classes=data.num_classes,
        out_shape=out_shape,
        eval_batch=eval_batch,
    )
