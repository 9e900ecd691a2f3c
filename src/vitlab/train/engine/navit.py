"""``--pack``: a run's loaders when it trains on packed images (NaViT: Dehghani et al. 2023, "Patch n' Pack").

Each training image keeps its aspect ratio: cropped at its own shape, given the token budget of a square whose side
is drawn per image in ``--pack-res``, patched, token-dropped (``--token-drop``, NaViT Sec. 3.4) and packed into
sequences of ``--pack-len`` tokens with the other images of its micro-batch (:mod:`vitlab.data.pipeline.navit`). A step
is ``--batch-size`` images, as in square training: an epoch has the same steps, the LR schedule, the time budget and
the exact resumption (the samples consumed, ``samples_in_epoch`` in ``last.pt``) are square training's, on any
number of processes, each packing its own share of the epoch's order. (NaViT fixes the tokens per batch instead, for
a TPU's fixed shapes; on a CPU a step costs its tokens either way.)

Evaluation reports the usual centre crop (the square loaders' evaluation, which these loaders wrap) and each image
at its own aspect ratio within the model's token budget (:func:`vitlab.evaluate.native_batches`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torchvision.transforms import v2

from ...data.pipeline.first_fit import PackSample, pack_groups
from ...data.pipeline.navit import KeptBytes, Patchify, SequenceBatches, ShardPatchify, SizedImages
from ...data.pipeline.seeding import item_seed, seeded
from ...data.shards.source import ShardSet
from ...data.shards.stream import KEEP_BYTES
from ...distributed import Dist, all_reduce_sum
from ...evaluate.own_aspect import native_batches, native_patchify
from ...models.packed import PackedPatches, drop_tokens, refusal
from ..conf.options import OptionError, ref
from ..conf.train_config import TrainConfig
from ..sizing.choice import Sizing
from ..sizing.memory import PackGeometry, pack_geometry
from .loaders import EpochCut, RunLoaders
from .shards import FirstSamples
from .signals import ignore_stop_signals

__all__ = ["NavitLoaders", "navit_loaders", "packed_counts", "packed_metrics"]


@dataclass(kw_only=True)
class NavitLoaders(EpochCut):
    """This process's packed training batches (``(PackedPatches, labels)``), the wrapped square loaders'
    centre-crop evaluation, and the evaluation at native aspect ratio (:meth:`native_eval_batches`)."""

    square: RunLoaders
    model: nn.Module
    """The ViT (its configuration and prefix tokens: the native evaluation's token budget)."""
    train_source: Any
    val_source: Any
    patchify: Patchify
    geometry: PackGeometry
    dist: Dist
    workers: int
    num_classes: int
    window: int
    token_drop: float = 0.0
    packed: ClassVar[bool] = True
    evaluations: ClassVar[int] = 2  # the centre crop and the native aspect ratio
    _current: SequenceBatches | None = field(default=None, init=False, repr=False)
    _probe: FirstSamples | None = field(default=None, init=False, repr=False)
    _sized: SizedImages | None = field(default=None, init=False, repr=False)
    _eval_sized: SizedImages | None = field(default=None, init=False, repr=False)

    @property
    def generator(self) -> torch.Generator:  # type: ignore[override]
        return self.square.generator

    @property
    def mix(self) -> None:
        return None

    @property
    def eval_batch(self) -> int:  # type: ignore[override]
        return self.square.eval_batch

    @property
    def eval_size(self) -> int:
        return self.square.eval_size

    def __post_init__(self) -> None:
        keep = KeptBytes(0 if self.workers else KEEP_BYTES)  # each image resized once and kept, without workers
        if not isinstance(self.train_source, ShardSet):
            self._sized = SizedImages(self.train_source.images, self.patchify, keep_bytes=keep)
        if not isinstance(self.val_source, ShardSet):  # evaluated every epoch: kept too, within the same cap
            self._eval_sized = SizedImages(self.val_source.images, native_patchify(self.model), keep_bytes=keep)

    @property
    def first_epoch_fills(self) -> bool:
        return self._sized is not None and self._sized.keeps

    def set_token_drop(self, rate: float) -> bool:
        changed = rate != self.token_drop
        self.token_drop = rate
        if self._current is not None:
            self._current.token_drop = rate  # read as each image is packed: from the next batch on
        return changed

    def train_batches(self, epoch: int, start_micro: int = 0) -> Iterator[tuple[PackedPatches, torch.Tensor]]:
        per_micro = self.micro * self.dist.world_size  # samples of one micro-batch, all ranks together
        self._current = SequenceBatches(
            source=self.train_source, patchify=self.patchify, pack_len=self.geometry.pack_len,
            prefix_tokens=self.geometry.prefix, images=self.micro, seed=self.seed, epoch=epoch,
            start=start_micro * per_micro, stop=self.micro_per_epoch * per_micro, rank=self.dist.rank,
            world=self.dist.world_size, token_drop=self.token_drop, workers=self.workers,
            worker_init_fn=ignore_stop_signals, generator=self.epoch_generator(epoch), num_classes=self.num_classes,
            window=self.window, sized=self._sized,
        )  # fmt: skip
        return ((b.packed, b.labels) for b in self._current)

    def eval_batches(self) -> Iterable[Any]:
        return self.square.eval_batches()

    def native_eval_batches(self) -> Iterable[tuple[PackedPatches, torch.Tensor]]:
        return native_batches(
            self.model, self.val_source, sequences=self.eval_batch, workers=self.workers,
            num_classes=self.num_classes, rank=self.dist.rank, world=self.dist.world_size,
            worker_init_fn=ignore_stop_signals, sized=self._eval_sized,
        )  # fmt: skip

    def train_items(self, n: int) -> list[tuple[Any, int]]:
        """The first ``n`` training images patched (each with its draws of epoch 0), for the time budget's probe."""
        if isinstance(self.train_source, ShardSet):
            if self._probe is None:
                self._probe = FirstSamples(shards=self.train_source, transform=ShardPatchify(patchify=self.patchify))
            return [self._probe.get(i) for i in range(n)]
        images, labels = self.train_source.images, self.train_source.labels
        out = []
        for i in range(n):
            with seeded(item_seed(self.seed, 0, i)):
                out.append((self.patchify(images[i % len(labels)]), int(labels[i % len(labels)])))
        return out

    def step_input(self, x: Any, *, side: int | None) -> tuple[Any, int, int]:
        return x, int((x.image_ids >= 0).sum()), x.image_ids.numel()  # one size a batch: no resolution schedule

    def collate_train(self, xs: list[Any]) -> PackedPatches:
        """Patched images as one packed micro-batch, their tokens dropped at the current rate."""
        g = torch.Generator().manual_seed(0)
        kept = [drop_tokens(t, self.token_drop, generator=g) if self.token_drop else t for t in xs]
        samples = [PackSample(t, 0, i) for i, t in enumerate(kept)]
        geo = self.geometry
        return next(pack_groups(samples, pack_len=geo.pack_len, images=len(samples), prefix_tokens=geo.prefix)).packed

    def eval_items(self, start: int, stop: int) -> list[torch.Tensor]:
        return self.square.eval_items(start, stop)


def navit_loaders(
    cfg: TrainConfig, sizing: Sizing, *, square: RunLoaders, data: Any, model: nn.Module, dist: Dist
) -> NavitLoaders:
    """The packed loaders of the run ``cfg`` around its ``square`` loaders (their evaluation, their epoch plan):
    the recipe's crop (at each image's own aspect ratio), flip and RandAugment at the packed size, the model's
    normalisation, ``--pack-res`` and ``--pack-len`` (:func:`pack_geometry`); a model that cannot take packed
    images (a hybrid or convolutional stem, axial attention ...: :func:`~vitlab.models.packed.refusal`) is refused
    before any step."""
    r, mc, workers = sizing.recipe, model.config, sizing.workers
    if why := refusal(model):
        raise OptionError(ref("pack"), f": not supported with this model ({mc.name}: {why})")
    geo = pack_geometry(cfg, mc)
    augment = v2.RandAugment(num_ops=r.randaugment[0], magnitude=r.randaugment[1]) if r.randaugment else None
    patchify = Patchify(
        patch_size=mc.patch_size, resolution=geo.resolution, mean=mc.mean, std=mc.std, in_chans=mc.in_chans,
        crop_scale=tuple(r.crop_scale), crop_ratio=tuple(r.crop_ratio), hflip=r.hflip, augment=augment,
    )  # fmt: skip
    return NavitLoaders(
        square=square, model=model, train_source=data.train, val_source=data.val, patchify=patchify, geometry=geo,
        dist=dist, workers=workers, num_classes=data.num_classes, window=cfg.shuffle_buffer,
        token_drop=r.token_drop, micro=square.micro, accum_steps=square.accum_steps,
        steps_per_epoch=square.steps_per_epoch, seed=cfg.seed, rank=dist.rank,
    )  # fmt: skip


def packed_counts(position: Any, loaders: RunLoaders, dist: Dist) -> tuple[int, int]:
    """The epoch's ``(tokens, slots)`` so far, all processes together (a collective under torchrun); ``(0, 0)`` for
    square loaders. ``position``: the run's :class:`~vitlab.train.persist.position.RunPosition`."""
    if not loaders.packed:
        return 0, 0
    t = all_reduce_sum(torch.tensor([position.tokens, position.slots], dtype=torch.int64), dist)
    return int(t[0]), int(t[1])


def packed_metrics(
    objective: Any, eval_net: nn.Module, *, loaders: RunLoaders, position: Any, dist: Dist, device: torch.device,
    amp_dtype: torch.dtype | None, images_per_sec: float,
) -> dict[str, float]:  # fmt: skip
    """A packed run's epoch: the evaluation at native aspect ratio beside the centre crop's, the padding of the
    training sequences and the tokens a second (images a second x the epoch's mean tokens an image). The mean is
    taken over the images of the micro-batches the epoch made (``position.micro``, before a resume too): a time
    budget's last epoch ends part-way, and its tokens are that part's."""
    nev = objective.evaluate(eval_net, loaders.native_eval_batches(), device=device, amp_dtype=amp_dtype, dist=dist)
    tokens, slots = packed_counts(position, loaders, dist)
    images = position.micro * loaders.micro * dist.world_size
    return {
        "top1_native": nev["top1"],
        "top5_native": nev["top5"],
        "eval_loss_native": nev["loss"],
        "padding": 1 - tokens / max(slots, 1),
        "tokens_per_sec": images_per_sec * tokens / max(images, 1),
    }
