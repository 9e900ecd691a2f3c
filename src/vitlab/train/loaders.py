"""A run's data: the splits (rank 0 builds the decode cache first), the augmented training set
sharded over processes, resumable mid-epoch, and each process's exact share of the evaluation split."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from ..data.loading import Batches
from ..data.seeding import SeededItems, item_seed
from ..errors import ConfigError
from .config import TrainConfig
from .distributed import Dist, barrier
from .image_size import folder_plan
from .loop import ignore_stop_signals
from .spec.rules import micro_batch

if TYPE_CHECKING:
    from ..data.sources import DataSplits, ImageArray
    from ..models import ViTConfig

__all__ = [
    "Loaders",
    "build_loaders",
    "check_data_unchanged",
    "data_fingerprint",
    "eval_shard",
    "load_run_data",
    "micro_batch",
    "run_data_fingerprint",
]


def load_run_data(
    cfg: TrainConfig, *, dist: Dist, out: Path, log: Callable[[str], None], labels: bool = True
) -> DataSplits:
    """The run's train and evaluation splits. Rank 0 decodes first (and writes the shared cache)
    while the others wait; undecodable files are listed in ``out/bad_files.txt``. A folder is stored at the
    size the run trains at, decided from its headers first (:func:`~vitlab.train.image_size.folder_plan`),
    and the choice is the first line logged."""
    from ..data import load_data
    from ..data.sources import DataError
    from ..data.stream import is_shard_spec, open_stream_data

    if is_shard_spec(cfg.data):  # tar shards: read as they train, no decode cache
        data = open_stream_data(cfg.data, val_split=cfg.val_split, allow_pipe=cfg.allow_pipe)
        if len(data.train) == 0 or len(data.val) == 0:
            raise DataError(f"--data {cfg.data}: empty train or evaluation split")
        return data

    def get_data():
        return load_data(
            cfg.data,
            val_split=cfg.val_split,
            plan=functools.partial(folder_plan, cfg),
            cache_dir=cfg.cache_dir,
            strict=cfg.strict_data,
            progress=cfg.progress and dist.is_main,
            max_image_pixels=cfg.max_image_pixels,
            buffer_bytes=cfg.memory_budget,
            min_classes=1 if cfg.allow_single_class or not labels else 2,  # an objective without labels: 1
        )

    if dist.is_main:
        data = get_data()
    barrier(dist)
    if not dist.is_main:
        data = get_data()
    from ..data.cache_admin import cache_line

    if data.plan is not None:
        log(data.plan.line)
    if (line := cache_line(data.cache_files)) is not None:
        log(line)
    if data.skipped:
        log(f"warning: skipped {len(data.skipped)} file(s) that cannot be decoded; list in {out / 'bad_files.txt'}")
        if dist.is_main:
            (out / "bad_files.txt").write_text("".join(f"{p}\t{why}\n" for p, why in data.skipped))
    if data.num_classes == 1 and labels:
        log(f"warning: --data {cfg.data}: only one class ({data.class_names[0]!r}); top-1 is 100% by construction")
    if len(data.train) == 0 or len(data.val) == 0:
        raise DataError(f"--data {cfg.data}: empty train or evaluation split")
    return data


def data_fingerprint(cfg: TrainConfig) -> dict[str, Any] | None:
    """What a folder run trains on, kept in ``last.pt`` so that ``--resume`` can tell whether the data changed:
    the class names and, per split folder, its number of image files and the decode cache's key of their
    paths, sizes and modification times (:func:`vitlab.data.cache.cache_key`). The files are listed as
    :func:`vitlab.data.load_data` lists them (only their metadata is read). None for the built-in
    datasets (digits, CIFAR), which do not change, and for a ``--data`` that is no folder."""
    from ..data.cache import cache_key
    from ..data.scan import scan_classes
    from ..data.shard_source import is_shard_spec, open_source

    if is_shard_spec(cfg.data):  # the shards' names, sample counts and checksums
        return open_source(cfg.data, val_split=cfg.val_split, allow_pipe=cfg.allow_pipe).fingerprint()
    root = Path(cfg.data).expanduser()
    if not root.is_dir():
        return None
    train = root / "train"
    val = next((root / n for n in ("val", "valid", "validation", "test") if (root / n).is_dir()), None)
    if train.is_dir() and val is not None and cfg.val_split is None:  # load_data's choice of split folders
        dirs = {"train": train, val.name: val}
    else:
        dirs = {train.name if train.is_dir() else ".": train if train.is_dir() else root}
    classes: list[str] | None = None
    splits = {}
    for name, d in dirs.items():
        paths, _, found = scan_classes(d, classes)
        classes = classes or found
        splits[name] = {"files": len(paths), "key": cache_key(paths, None, "fingerprint")}
    return {"classes": classes, "splits": splits}


def run_data_fingerprint(
    cfg: TrainConfig, *, state: dict[str, Any] | None, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """The data fingerprint a run keeps in ``last.pt`` (:func:`data_fingerprint`, taken before decoding):
    a new run's, now. A resumed run keeps the one saved when it started, after checking that the data
    still matches it (:func:`check_data_unchanged`); a checkpoint from before fingerprints resumes as it
    did, with a note, and keeps today's from then on."""
    now = data_fingerprint(cfg)
    if state is None:
        return now
    if "data_fingerprint" not in state:
        log("note: this last.pt predates data fingerprints: the data is not checked against the run's start")
        return now
    saved = json.loads(state["data_fingerprint"])
    check_data_unchanged(saved, now, data=cfg.data)
    return saved


def check_data_unchanged(saved: dict[str, Any] | None, now: dict[str, Any] | None, *, data: str) -> None:
    """Refuse to resume on data other than the run started with (``saved`` and ``now`` are fingerprints
    of :func:`data_fingerprint`): one :class:`~vitlab.data.sources.DataError` that lists what changed.
    A resumed run on other files would train a different model (or stop early: fewer steps per epoch)
    or fail to load its weights (a class added)."""
    from ..data.sources import DataError

    if saved is None or now is None:  # a built-in dataset; a --data folder that is gone fails as it loads
        return
    changes = [f"class {c!r} added" for c in now["classes"] if c not in saved["classes"]]
    changes += [f"class {c!r} removed" for c in saved["classes"] if c not in now["classes"]]
    for name in {**saved["splits"], **now["splits"]}:
        a, b = saved["splits"].get(name), now["splits"].get(name)
        if a is None or b is None:
            changes.append(f"split folder {name!r} {'added' if a is None else 'removed'}")
        elif b["files"] != a["files"]:
            n = b["files"] - a["files"]
            changes.append(f"{abs(n)} file(s) {'added to' if n > 0 else 'removed from'} {name}")
        elif b["key"] != a["key"]:
            changes.append(f"files in {name} renamed, replaced or modified ({a['files']} files either way)")
    if changes:
        raise DataError(
            f"--resume: the data changed since the run started ({data}): {', '.join(changes)}; "
            "start a new run (--out elsewhere or --overwrite)"
        )


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
class Loaders:
    """This process's training and evaluation data. The training loader is made per epoch (the
    sampler's shuffle depends on it) and can start part-way into the epoch. Each training sample's
    augmentation is drawn from its own generator, seeded by ``(seed, epoch, sample)``
    (:class:`~vitlab.data.seeding.SeededItems`), so that neither the workers nor where a resumed loader
    starts can change it; ``generator`` seeds the evaluation loader's workers (its state is part of ``last.pt``)."""

    train_ds: Dataset
    val_ds: Dataset
    sampler: DistributedSampler | None
    micro: int
    """Images per forward pass on this process."""
    accum_steps: int
    steps_per_epoch: int
    workers: int
    generator: torch.Generator
    eval_loader: Iterable
    mix: Callable | None
    """MixUp / CutMix on the device, or None."""
    seed: int = 0
    rank: int = 0
    eval_batch: int = 256
    """Images an evaluation pass."""

    @property
    def micro_per_epoch(self) -> int:
        """Micro-batches of one full epoch (whole accumulated steps only)."""
        return self.steps_per_epoch * self.accum_steps

    def epoch_generator(self, epoch: int) -> torch.Generator:
        """The generator of epoch ``epoch``'s training DataLoader (it seeds the workers' own generators, which
        augmentation does not use): a new one per epoch and rank, so that no saved state feeds it."""
        return torch.Generator().manual_seed(item_seed(self.seed, epoch, -1 - self.rank))

    def train_loader(self, epoch: int, start_micro: int = 0) -> Iterable:
        """Epoch ``epoch``'s batches from micro-batch ``start_micro`` on."""
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


def build_loaders(
    cfg: TrainConfig,
    *,
    data: DataSplits,
    model_config: ViTConfig,
    dist: Dist,
    device: torch.device,
    workers: int,
    eval_batch: int | None = None,
    labels: bool = True,
) -> Loaders:
    """Datasets with the recipe's augmentation (training) and centre crop (evaluation) at the model's
    resolution and normalisation; checks that the global batch divides into processes and accumulation
    steps and that one epoch holds at least one optimizer step. ``eval_batch``: images an evaluation pass
    (:func:`vitlab.train.memory.fit_memory`; None: the micro-batch, at least 256)."""
    from ..data import ArrayDataset, eval_transform, mix_transform, train_transform
    from ..data.stream import StreamData

    if isinstance(data, StreamData):
        from .stream_loaders import build_stream_loaders

        return build_stream_loaders(
            cfg,
            data=data,
            model_config=model_config,
            dist=dist,
            device=device,
            workers=workers,
            eval_batch=eval_batch,
            labels=labels,
        )
    r, mcfg = cfg.recipe, model_config
    micro = micro_batch(r.batch_size, world_size=dist.world_size, accum_steps=r.accum_steps)
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
        raise ConfigError(f"--batch-size {r.batch_size} is larger than the training set ({len(data.train)} images)")
    mix = mix_transform(num_classes=data.num_classes, mixup=r.mixup, cutmix=r.cutmix) if labels else None
    generator = torch.Generator().manual_seed(cfg.seed + 1000 * dist.rank)
    eval_loader = DataLoader(
        val_ds,
        batch_size=eval_batch or max(micro, 256),
        shuffle=False,
        num_workers=workers if device.type == "cuda" else 0,
        generator=generator,
        worker_init_fn=ignore_stop_signals,
    )
    return Loaders(
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
    )
