"""A run's loaders over tar shards (:mod:`vitlab.data.shards.stream`): the epoch's global order from the sample the run
has consumed, this rank's share of it, and the evaluation split split over ranks (:class:`ShardLoaders`, one of the
:class:`~vitlab.train.engine.loaders.RunLoaders`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from ...data import eval_transform, mix_transform, train_transform
from ...data.shards.source import ShardSet, image_and_label, iter_samples, open_shard
from ...data.shards.stream import (
    KEEP_BYTES,
    EvalDecode,
    KeptBatches,
    KeptDecode,
    ShardStream,
    StreamBatches,
    StreamData,
    TrainDecode,
)
from ...distributed import Dist
from ..conf.train_config import TrainConfig
from ..sizing.choice import Sizing
from .loaders import EpochCut, too_few_images
from .signals import ignore_stop_signals

if TYPE_CHECKING:
    from ...models import ViTConfig

__all__ = ["FirstSamples", "ShardLoaders", "build_shard_loaders"]


@dataclass(kw_only=True)
class FirstSamples:
    """The first ``k`` samples of a split's shards, read when first asked for and decoded per item by
    ``transform``: what the time budget's probe times (it takes a few items, cycling through these)."""

    shards: ShardSet
    transform: Callable
    k: int = 32
    _items: list[tuple[bytes, int]] = field(default_factory=list, init=False, repr=False)

    def get(self, i: int) -> tuple[torch.Tensor, int]:
        if not self._items:
            for sh in self.shards.shards:
                with open_shard(sh.url) as tar:
                    for _, key, parts in iter_samples(tar, lambda i: True):
                        self._items.append(image_and_label(parts, where=f"{sh.url}: {key}"))
                        if len(self._items) >= self.k:
                            break
                if len(self._items) >= self.k:
                    break
        data, y = self._items[i % len(self._items)]
        return self.transform(data), y


@dataclass(kw_only=True)
class ShardLoaders(EpochCut):
    """This process's loaders over shards: :meth:`train_batches` starts epoch ``epoch`` at global sample
    ``start_micro x micro x world`` (the samples all ranks have consumed), so a run resumes exactly on any
    number of processes."""

    shards: ShardSet
    train_tf: Callable
    window: int
    dist: Dist
    num_classes: int
    out_shape: tuple[int, ...]
    workers: int
    generator: torch.Generator
    eval_loader: Iterable[Any]
    mix: Callable | None
    eval_size: int
    probe_train: FirstSamples
    probe_eval: FirstSamples
    eval_batch: int = 256

    def train_batches(self, epoch: int, start_micro: int = 0) -> StreamBatches:
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

    @property
    def first_epoch_fills(self) -> bool:
        return isinstance(self.train_tf, KeptDecode) and self.train_tf.keep_bytes > 0  # decoded once, then kept

    def eval_batches(self) -> Iterable[Any]:
        return self.eval_loader

    def train_items(self, n: int) -> list[tuple[torch.Tensor, int]]:
        return [self.probe_train.get(i) for i in range(n)]

    def eval_items(self, start: int, stop: int) -> list[torch.Tensor]:
        return [self.probe_eval.get(i)[0] for i in range(start, stop)]


def build_shard_loaders(
    cfg: TrainConfig,
    sizing: Sizing,
    *,
    data: StreamData,
    model_config: ViTConfig,
    dist: Dist,
    device: torch.device,
    labels: bool = True,
) -> ShardLoaders:
    """The training and evaluation loaders of shard data with the sizing's recipe's augmentation, micro-batch,
    evaluation batch and workers; one epoch is ``len(train) // batch_size`` optimizer steps on every rank."""
    r, mcfg, micro, workers = sizing.recipe, model_config, sizing.micro, sizing.workers
    steps_per_epoch = len(data.train) // r.batch_size
    if steps_per_epoch < 1:
        raise too_few_images(r.batch_size, len(data.train))
    size = (mcfg.img_size, mcfg.img_size) if isinstance(mcfg.img_size, int) else tuple(mcfg.img_size)
    storage = data.storage
    common = {"img_size": size, "mean": mcfg.mean, "std": mcfg.std, "in_chans": mcfg.in_chans, "hflip": r.hflip,
              "randaugment": r.randaugment, "random_erasing": r.random_erasing}  # fmt: skip
    train_tf: Callable
    if storage is not None and storage.store_side is not None:  # the folder's pixels and transform, kept w/o workers
        full = train_transform(**common, crop_scale=r.crop_scale, crop_ratio=r.crop_ratio, crop_pct=r.crop_pct)
        train_tf = KeptDecode(store_side=storage.store_side, in_chans=mcfg.in_chans, tf=full,
                              keep_bytes=KEEP_BYTES if workers == 0 else 0)  # fmt: skip
    else:  # the crop drawn on the original as it is decoded, then the rest of the transform
        train_tf = TrainDecode(img_size=size, crop_scale=r.crop_scale, crop_ratio=r.crop_ratio, in_chans=mcfg.in_chans,
                               rest=train_transform(**common, crop=False))  # fmt: skip
    tf = eval_transform(img_size=size, mean=mcfg.mean, std=mcfg.std, in_chans=mcfg.in_chans, crop_pct=r.crop_pct)
    eval_tf = EvalDecode(in_chans=mcfg.in_chans, tf=tf)  # at full scale: vitlab eval's pixels (no JPEG draft)
    out_shape = (mcfg.in_chans, *size)
    eval_batch = sizing.eval_batch
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
    return ShardLoaders(
        probe_train=FirstSamples(shards=data.train, transform=train_tf),
        probe_eval=FirstSamples(shards=data.val, transform=eval_tf),
        eval_size=len(val),
        micro=micro,
        accum_steps=r.accum_steps,
        steps_per_epoch=steps_per_epoch,
        workers=workers,
        generator=generator,
        eval_loader=KeptBatches(StreamBatches(eval_loader)),
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
