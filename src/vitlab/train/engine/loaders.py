"""The loaders of a run, behind one small interface (:class:`RunLoaders`): this process's training batches from
any point of an epoch, its share of the evaluation split, and a few items for the time budget's probe. A folder's
(or a built-in data set's) images: :class:`FolderLoaders`; tar shards: :class:`~.shards.ShardLoaders`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ...data import ArrayDataset, eval_transform, mix_transform, train_transform
from ...data.pipeline.loading import Batches
from ...data.pipeline.seeding import SeededItems, item_seed
from ...distributed import Dist
from ..conf.options import OptionError, ref
from ..conf.train_config import TrainConfig
from ..sizing.choice import Sizing
from .schedule import resize_batch
from .signals import ignore_stop_signals

if TYPE_CHECKING:
    from ...data.sources import DataSplits, ImageArray
    from ...models import ViTConfig

__all__ = ["EpochCut", "FolderLoaders", "RunLoaders", "build_folder_loaders", "eval_shard", "too_few_images"]


class RunLoaders(Protocol):
    """What the trainer and the time budget read of a run's loaders."""

    micro: int
    """Images per forward pass on this process."""
    accum_steps: int
    steps_per_epoch: int
    workers: int
    eval_batch: int
    """Images an evaluation pass."""
    num_classes: int
    generator: torch.Generator
    """Seeds the evaluation loader's workers (its state is part of ``last.pt``)."""
    mix: Callable | None
    """MixUp / CutMix on the device, or None."""
    eval_size: int
    """Images of this process's share of the evaluation split."""
    packed: bool
    """Whether the training batches are packed images (``--pack``: :mod:`.navit`)."""
    evaluations: int
    """Evaluations a run makes at each epoch's end (the time budget counts them)."""

    @property
    def micro_per_epoch(self) -> int: ...

    @property
    def first_epoch_fills(self) -> bool:
        """Whether the first epoch fills what the later ones read from memory (its steps cost more)."""
        ...

    def set_token_drop(self, rate: float) -> bool:
        """Drop ``rate`` of each image's tokens as the loader packs it (from the next batch); True when it changed.
        False and nothing done where the model drops them (square batches)."""
        ...

    def collate_train(self, xs: list[Any]) -> Any:
        """The model's input of :meth:`train_items`' images (the probe's batch)."""
        ...

    def step_input(self, x: Any, *, side: int | None) -> tuple[Any, int, int]:
        """A training micro-batch ``x`` (on the device) as the step takes it, and its ``(tokens, slots)``: square
        images resized to the resolution schedule's ``side`` (None: as loaded), ``(0, 0)``; packed sequences as
        they are, with the token slots that hold an image and all their slots (the padding metric)."""
        ...

    def native_eval_batches(self) -> Iterable[Any] | None:
        """The evaluation split at each image's own aspect ratio (packed runs), else None."""
        ...

    def train_batches(self, epoch: int, start_micro: int = 0) -> Iterable[Any]:
        """Epoch ``epoch``'s batches from micro-batch ``start_micro`` on."""
        ...

    def eval_batches(self) -> Iterable[Any]: ...

    def train_items(self, n: int) -> list[tuple[torch.Tensor, int]]:
        """``n`` augmented training items (the probe's batch; timing them times the augmentation)."""
        ...

    def eval_items(self, start: int, stop: int) -> list[torch.Tensor]:
        """Evaluation images ``start:stop`` of this process's share, transformed (the probe's evaluation)."""
        ...


@dataclass(kw_only=True)
class EpochCut:
    """How an epoch is cut: ``micro`` images a forward pass, ``accum_steps`` of them an optimizer step, and the
    per-epoch generators, a new one per epoch and rank so that no saved state feeds them."""

    micro: int
    accum_steps: int
    steps_per_epoch: int
    seed: int = 0
    rank: int = 0
    packed: ClassVar[bool] = False
    evaluations: ClassVar[int] = 1

    @property
    def micro_per_epoch(self) -> int:
        """Micro-batches of one full epoch (whole accumulated steps only)."""
        return self.steps_per_epoch * self.accum_steps

    def epoch_generator(self, epoch: int) -> torch.Generator:
        """The generator of epoch ``epoch``'s training DataLoader (it seeds the workers' own generators, which
        augmentation does not use)."""
        return torch.Generator().manual_seed(item_seed(self.seed, epoch, -1 - self.rank))

    @property
    def first_epoch_fills(self) -> bool:
        """Whether the first epoch fills what the later ones read from this process's memory, so that its steps
        cost more than theirs (the time budget's :attr:`~vitlab.train.sizing.budget.Replanner.first_steps`)."""
        return False

    def set_token_drop(self, rate: float) -> bool:
        return False  # the model's PatchDropout drops tokens from square batches

    def collate_train(self, xs: list[Any]) -> Any:
        return torch.stack(xs)

    def step_input(self, x: Any, *, side: int | None) -> tuple[Any, int, int]:
        return (x if side is None else resize_batch(x, side)), 0, 0

    def native_eval_batches(self) -> Iterable[Any] | None:
        return None


class _SkipSampler(Sampler[int]):
    """Another sampler's indices ``start:stop``: resuming in the middle of an epoch, and no
    trailing micro-batches that would not complete an accumulated step."""

    def __init__(self, base: Sampler[int], start: int = 0, stop: int | None = None) -> None:
        self.base, self.start, self.stop = base, start, stop

    def __iter__(self) -> Iterator[int]:
        for i, idx in enumerate(self.base):
            if self.stop is not None and i >= self.stop:
                break
            if i >= self.start:
                yield idx

    def __len__(self) -> int:
        n = len(self.base) if self.stop is None else min(self.stop, len(self.base))  # type: ignore[arg-type]
        return max(0, n - self.start)


def eval_shard(val: ImageArray, rank: int, world_size: int) -> ImageArray:
    """Process ``rank``'s exact share of the evaluation split: rows ``rank, rank + world_size, ...``
    in order, as a view (the images are not copied out of a memory-mapped cache)."""
    return val.subset(np.arange(rank, len(val), world_size))


@dataclass(kw_only=True)
class FolderLoaders(EpochCut):
    """This process's training and evaluation data of images in memory (a folder's decode cache, a built-in data
    set). The training loader is made per epoch (the sampler's shuffle depends on it) and can start part-way into
    the epoch. Each training sample's augmentation is drawn from its own generator, seeded by
    ``(seed, epoch, sample)`` (:class:`~vitlab.data.pipeline.seeding.SeededItems`), so that neither the workers nor
    where a resumed loader starts can change it."""

    train_ds: ArrayDataset
    val_ds: ArrayDataset
    sampler: DistributedSampler
    workers: int
    generator: torch.Generator
    eval_loader: Iterable[Any]
    mix: Callable | None
    num_classes: int
    eval_batch: int = 256

    @property
    def eval_size(self) -> int:
        return len(self.val_ds)

    def train_batches(self, epoch: int, start_micro: int = 0) -> Iterable[Any]:
        self.sampler.set_epoch(epoch)
        loader = DataLoader(
            SeededItems(self.train_ds, seed=self.seed, epoch=epoch),
            batch_size=self.micro,
            sampler=_SkipSampler(self.sampler, start_micro * self.micro, self.micro_per_epoch * self.micro),
            drop_last=True,
            num_workers=self.workers,
            generator=self.epoch_generator(epoch),
            persistent_workers=False,
            worker_init_fn=ignore_stop_signals,
        )
        return Batches(loader)

    def eval_batches(self) -> Iterable[Any]:
        return self.eval_loader

    def train_items(self, n: int) -> list[tuple[torch.Tensor, int]]:
        return [self.train_ds[i % len(self.train_ds)] for i in range(n)]

    def eval_items(self, start: int, stop: int) -> list[torch.Tensor]:
        return [self.val_ds[i][0] for i in range(start, stop)]


def build_folder_loaders(
    cfg: TrainConfig,
    sizing: Sizing,
    *,
    data: DataSplits,
    model_config: ViTConfig,
    dist: Dist,
    device: torch.device,
    labels: bool = True,
) -> FolderLoaders:
    """Datasets with the sizing's recipe's augmentation (training) and centre crop (evaluation) at the model's
    resolution and normalisation, its micro-batch, evaluation batch and workers; checks that one epoch holds at
    least one optimizer step. ``labels``: whether the objective learns them (MixUp/CutMix mix them)."""
    r, mcfg, micro, workers = sizing.recipe, model_config, sizing.micro, sizing.workers
    tf_train = train_transform(
        img_size=mcfg.img_size,
        mean=mcfg.mean,
        std=mcfg.std,
        in_chans=mcfg.in_chans,
        crop_scale=r.crop_scale,
        crop_ratio=r.crop_ratio,
        hflip=r.hflip,
        randaugment=r.randaugment,
        random_erasing=r.random_erasing,
        crop_pct=r.crop_pct,
    )
    tf_eval = eval_transform(
        img_size=mcfg.img_size, mean=mcfg.mean, std=mcfg.std, in_chans=mcfg.in_chans, crop_pct=r.crop_pct
    )
    train_ds = ArrayDataset(data.train.images, data.train.labels, transform=tf_train, in_chans=mcfg.in_chans)
    shard = eval_shard(data.val, dist.rank, dist.world_size)
    val_ds = ArrayDataset(shard.images, shard.labels, transform=tf_eval, in_chans=mcfg.in_chans)
    sampler = DistributedSampler(
        train_ds, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    steps_per_epoch = len(sampler) // micro // r.accum_steps
    if steps_per_epoch < 1:
        raise too_few_images(r.batch_size, len(data.train))
    mix = mix_transform(num_classes=data.num_classes, mixup=r.mixup, cutmix=r.cutmix) if labels else None
    generator = torch.Generator().manual_seed(cfg.seed + 1000 * dist.rank)
    eval_loader = DataLoader(
        val_ds,
        batch_size=sizing.eval_batch,
        shuffle=False,
        num_workers=workers if device.type == "cuda" else 0,
        generator=generator,
        worker_init_fn=ignore_stop_signals,
    )
    return FolderLoaders(
        train_ds=train_ds,
        val_ds=val_ds,
        sampler=sampler,
        micro=micro,
        accum_steps=r.accum_steps,
        steps_per_epoch=steps_per_epoch,
        workers=workers,
        generator=generator,
        eval_loader=Batches(eval_loader),
        mix=mix,
        seed=cfg.seed,
        rank=dist.rank,
        eval_batch=eval_loader.batch_size,
        num_classes=data.num_classes,
    )


def too_few_images(batch_size: int, n: int) -> OptionError:
    """The error of a batch larger than the training set (no optimizer step in an epoch)."""
    return OptionError(ref("recipe.batch_size"), f" {batch_size} is larger than the training set ({n} images)")
