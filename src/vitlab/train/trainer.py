"""``fit``: data -> model -> optimiser -> epochs -> reports, with exact resume and DDP.

Outputs under ``out``: ``metrics.jsonl``, ``summary.json``, ``curves.png``, ``confusion.png``,
``model/`` (vitlab folder: best or last weights, class names, preprocessing) and ``last.pt``
(everything needed to resume: model, optimizer, scheduler, scaler, EMA, RNG states,
epoch and step, the run's configuration).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ..errors import ConfigError, NonFiniteLossError
from .distributed import Dist, barrier, broadcast_ints, setup, teardown
from .loop import EpochResult, evaluate, train_one_epoch
from .recipes import Recipe, get_recipe
from .report import append_metrics, plot_confusion, plot_curves, truncate_metrics, write_json
from .state import atomic_torch_save, get_rng_state, load_state, set_rng_state

if TYPE_CHECKING:
    from ..data.sources import ImageArray

__all__ = ["TrainConfig", "build_model", "fit"]


@dataclass
class TrainConfig:
    """One run: data, model choices, recipe (with overrides already applied) and run options."""

    recipe: Recipe = field(default_factory=lambda: get_recipe("digits"))
    data: str = "digits"
    out: str = "runs/default"
    model: str | None = None
    """Registered name; overrides ``recipe.model``/``recipe.arch``."""
    arch: dict[str, Any] = field(default_factory=dict)
    """Architecture overrides: ``patch_size``, ``embed_dim``, ``depth``, ``num_heads``, ``mlp_ratio``."""
    img_size: int | None = None
    init: str | None = None
    """Fine-tune from this model (a vitlab folder or any name/path ``vitlab.load`` accepts)."""
    objective: str = "classify"
    """``classify`` (labels, cross-entropy) or ``mpp``: masked patch prediction (Sec. 4.6), labels ignored,
    a headless ViT saved in ``model/``, "top-1" is the colour-prediction accuracy (:mod:`vitlab.train.mpp`)."""
    seed: int = 0
    workers: int = -1
    """DataLoader worker processes; -1: one worker when the model runs single-threaded on a
    machine with spare cores (augmentation then overlaps the step), else none."""
    device: str = "auto"
    precision: str = "auto"
    """``auto`` (bf16 autocast on GPU, fp32 on CPU), ``fp32``, ``bf16`` or ``fp16`` (with a GradScaler)."""
    compile: bool = False
    threads: int = 0
    """CPU threads for torch; 0: one thread when a training step is under ~2 GMACs (such small
    kernels lose more to thread synchronisation than they gain, badly so on a busy machine), else torch's default."""
    val_split: float | None = None
    cache_dir: str | None = None
    strict_data: bool = False
    max_image_pixels: int | None = None
    """Decompression-bomb guard: images with more pixels are skipped (default: PIL's 89.5 M)."""
    memory_budget: int | None = None
    """Memory budget in bytes of building the decode cache (default 64 MiB, at most half of it decoded
    images); the splits are then read from the memory map, so a dataset larger than RAM still trains."""
    on_nan: str = "stop"
    """A NaN/Inf loss: ``stop`` before the update (``last.pt`` keeps the last good state, exit 2) or ``skip`` the step and count it."""
    time_budget: float | None = None
    """Seconds for the whole run; the number of steps is planned from a measured step time."""
    save_every: float | None = None
    """Minutes between mid-epoch checkpoints (the end of each epoch always saves)."""
    stop_after: int | None = None
    """Save and exit after this many optimizer steps in this process (pre-emption drills, tests)."""
    keep: str = "best"
    """``model/`` holds the ``best`` (by top-1) or the ``last`` weights."""
    progress: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["recipe"] = self.recipe.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        d["recipe"] = Recipe.from_dict(d["recipe"])
        return cls(**d)


class _SkipSampler(Sampler[int]):
    """Another sampler's indices ``start:stop``: resuming in the middle of an epoch, and no
    trailing micro-batches that would not complete an accumulated step."""

    def __init__(self, base: Sampler[int], start: int = 0, stop: int | None = None) -> None:
        self.base, self.start, self.stop = base, start, stop

    def __iter__(self):
        for i, idx in enumerate(self.base):
            if self.stop is not None and i >= self.stop:
                break
            if i >= self.start:
                yield idx

    def __len__(self) -> int:
        n = len(self.base) if self.stop is None else min(self.stop, len(self.base))  # type: ignore[arg-type]
        return max(0, n - self.start)


def build_model(
    cfg: TrainConfig, *, num_classes: int, in_chans: int, image_size: tuple[int, int], class_names: list[str]
) -> nn.Module:
    """A fresh model from the recipe / name / overrides, or the ``init`` model adapted for
    fine-tuning: new resolution (position embeddings resampled, Sec. 3.2) and, when the classes
    differ or the pre-training MLP head is present, a new zero-initialised linear head."""
    from ..models import VisionTransformer, ViTConfig, model_config

    r = cfg.recipe
    if cfg.init:
        import vitlab

        base: nn.Module = vitlab.load(cfg.init)
        old = base.config
        img = cfg.img_size or r.img_size or old.img_size
        new_head = old.num_classes != num_classes or old.head != "linear"
        new = old.replace(
            img_size=img,
            num_classes=num_classes,
            head="linear",
            representation_size=None,
            class_names=list(class_names),
            drop_path_rate=r.drop_path,
            drop_rate=r.dropout,
        )
        model = type(base)(new) if isinstance(base, VisionTransformer) else VisionTransformer(new)
        state = base.state_dict()
        if new_head:
            state = {k: v for k, v in state.items() if not k.startswith(("head.", "pre_logits."))}
        missing, unexpected = model.load_state_dict(state, strict=False)
        bad = [k for k in missing if not k.startswith("head.")] + list(unexpected)
        if bad:
            raise ConfigError(f"--init {cfg.init}: weights do not fit the model ({', '.join(bad[:4])} ...)")
        return model

    name = cfg.model or r.model
    base_cfg = model_config(name) if name else ViTConfig(name="vit_custom", **r.arch)
    if not name and r.arch:
        base_cfg = base_cfg.replace(**r.arch)
    arch = dict(cfg.arch)
    ratio = arch.pop("mlp_ratio", None) or base_cfg.mlp_dim / base_cfg.embed_dim
    changes = {k: v for k, v in arch.items() if v is not None}
    if "embed_dim" in changes or cfg.arch.get("mlp_ratio"):
        changes["mlp_dim"] = round(changes.get("embed_dim", base_cfg.embed_dim) * ratio)
    img = cfg.img_size or r.img_size or image_size
    custom = bool(changes) or not name
    c = base_cfg.replace(
        **changes,
        img_size=img,
        in_chans=in_chans,
        num_classes=num_classes,
        head=r.head,
        drop_path_rate=r.drop_path,
        drop_rate=r.dropout,
        class_names=list(class_names),
    )
    if custom:  # e.g. vit_p4_d128_l6, or vit_r_p1_d128_l6 for a hybrid (ResNet stem) like vit_r_ti16
        stem = "" if c.hybrid_layers is None else "r" + "".join(str(n) for n in c.hybrid_layers) + "_"
        c = c.replace(name=f"vit_{stem}p{c.patch_size}_d{c.embed_dim}_l{c.depth}")
    return VisionTransformer(c)


_FLAGS = {
    "patch_size": "--patch-size",
    "embed_dim": "--dim",
    "depth": "--depth",
    "num_heads": "--heads",
    "img_size": "--img-size",
}


def validate_config(cfg: TrainConfig) -> None:
    """Reject impossible options before any data is decoded or any model built; each
    :class:`~vitlab.errors.ConfigError` names the command-line option (recipe values were
    checked when the :class:`Recipe` was made)."""
    from ..models import ViTConfig, model_config

    if cfg.on_nan not in ("stop", "skip"):
        raise ConfigError(f"--on-nan {cfg.on_nan!r}: choose stop or skip")
    for flag, v, ok in (
        ("--save-every", cfg.save_every, lambda x: x > 0),
        ("--stop-after", cfg.stop_after, lambda x: x >= 1),
        ("--time-budget", cfg.time_budget, lambda x: x > 0),
        ("--max-image-pixels", cfg.max_image_pixels, lambda x: x >= 1),
        ("--memory-budget", cfg.memory_budget, lambda x: x >= 1),
        ("--img-size", cfg.img_size, lambda x: x >= 1),
        ("--val-split", cfg.val_split, lambda x: 0 < x < 1),
    ):
        if v is not None and not ok(v):
            raise ConfigError(f"{flag} {v}: out of range")
    if cfg.workers < -1 or cfg.threads < 0:
        raise ConfigError(f"--workers {cfg.workers} / --threads {cfg.threads}: must be >= -1 / >= 0")
    r = cfg.recipe
    if cfg.init:
        _check_init_matches(cfg)
        return
    name = cfg.model or r.model
    base = model_config(name) if name else ViTConfig(name="vit_custom", **r.arch)
    changes = {k: v for k, v in cfg.arch.items() if k in _FLAGS and v is not None}
    img = cfg.img_size or r.img_size
    patch = changes.get("patch_size", base.patch_size) * base.stem_stride
    changes["img_size"] = img or 4 * patch  # the data's own size is checked once it is known
    try:
        base.replace(**changes)
    except ConfigError as e:
        opt, _, msg = str(e).partition(": ")
        raise ConfigError(f"{_FLAGS.get(opt, opt)}: {msg}") from None


def _check_init_matches(cfg: TrainConfig) -> None:
    """``--init`` takes the architecture from the checkpoint: flags that contradict it are an error."""
    from ..models import model_config

    wanted = {k: v for k, v in cfg.arch.items() if k in _FLAGS and v is not None}
    if cfg.model:
        m = model_config(cfg.model)
        wanted = {
            "patch_size": m.patch_size,
            "embed_dim": m.embed_dim,
            "depth": m.depth,
            "num_heads": m.num_heads,
            **wanted,
        }
    if not wanted:
        return
    import vitlab

    have = vitlab.load(cfg.init).config
    for k, v in wanted.items():
        if getattr(have, k) != v:
            flag = "--model " + cfg.model if cfg.model and k not in cfg.arch else f"{_FLAGS[k]} {v}"
            raise ConfigError(
                f"{flag} does not match the --init checkpoint {cfg.init} ({k} = {getattr(have, k)}); drop the flag or pick another checkpoint"
            )


def micro_batch_estimate(cfg: TrainConfig, d: Dist) -> int:
    return max(1, cfg.recipe.batch_size // (d.world_size * cfg.recipe.accum_steps))


def _amp(precision: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    if precision == "auto":
        return (torch.bfloat16 if device.type == "cuda" else None), False
    return {"fp32": (None, False), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, True)}[precision]


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def eval_shard(val: ImageArray, rank: int, world_size: int) -> ImageArray:
    """Process ``rank``'s exact share of the evaluation split: rows ``rank, rank + world_size, ...``
    in order, as a view (the images are not copied out of a memory-mapped cache)."""
    return val.subset(np.arange(rank, len(val), world_size))


class _Stop(Exception):
    pass


def fit(cfg: TrainConfig, *, resume: bool = False) -> dict[str, Any]:
    """Train (or resume) one run; returns the summary (also written to ``out/summary.json``).

    ``summary["interrupted"]`` is True when the run stopped early (Ctrl-C, ``stop_after``);
    ``last.pt`` then holds the exact position to continue from.
    """
    out = Path(cfg.out)
    ckpt_path = out / "last.pt"
    on_nan = cfg.on_nan
    state: dict[str, Any] | None = None
    if resume:
        state = load_state(ckpt_path)
        saved = TrainConfig.from_dict(json.loads(state["config"]))
        # Resume the saved run; only the run-control options may change.
        cfg = dataclasses.replace(
            saved,
            workers=cfg.workers,
            stop_after=cfg.stop_after,
            save_every=cfg.save_every,
            progress=cfg.progress,
            out=cfg.out,
            memory_budget=cfg.memory_budget,  # a property of the machine the run continues on, not of the run
        )
        if on_nan != "stop":  # the one numerical-safety option a resumed run may relax
            cfg.on_nan = on_nan
    validate_config(cfg)
    from .mpp import OBJECTIVES

    if cfg.objective not in OBJECTIVES:
        raise ConfigError(f"--objective {cfg.objective!r}: choose one of {', '.join(OBJECTIVES)}")
    d, device = setup(cfg.device)
    try:
        return _fit(cfg, d, device, out, state)
    finally:
        teardown()


def _fit(cfg: TrainConfig, d: Dist, device: torch.device, out: Path, state: dict[str, Any] | None) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from ..data import ArrayDataset, eval_transform, load_data, mix_transform, train_transform
    from ..data.sources import DataError

    r = cfg.recipe
    t_start = time.perf_counter()
    log = print if d.is_main else (lambda *a, **k: None)
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)

    # -- data (rank 0 builds the decode cache first) -----------------------------------------
    def get_data():
        return load_data(
            cfg.data,
            val_split=cfg.val_split,
            size=_cache_size(cfg),
            cache_dir=cfg.cache_dir,
            strict=cfg.strict_data,
            progress=cfg.progress and d.is_main,
            max_image_pixels=cfg.max_image_pixels,
            buffer_bytes=cfg.memory_budget,
        )

    if d.is_main:
        data = get_data()
    barrier(d)
    if not d.is_main:
        data = get_data()
    if data.skipped:
        log(f"warning: skipped {len(data.skipped)} file(s) that cannot be decoded; list in {out / 'bad_files.txt'}")
        if d.is_main:
            (out / "bad_files.txt").write_text("".join(f"{p}\t{why}\n" for p, why in data.skipped))
    if len(data.train) == 0 or len(data.val) == 0:
        raise DataError(f"--data {cfg.data}: empty train or evaluation split")

    # -- model ----------------------------------------------------------------------------
    from .mpp import evaluate_mpp, unwrap, wrap

    mpp = cfg.objective == "mpp"
    _seed_all(cfg.seed)  # same initial weights on every rank
    n_cls, names = (0, []) if mpp else (data.num_classes, data.class_names)  # MPP pre-trains a headless ViT
    model = build_model(cfg, num_classes=n_cls, in_chans=data.in_chans, image_size=data.image_size, class_names=names)
    net = wrap(
        model, cfg.objective
    )  # what the optimiser trains: the ViT, or the ViT plus the MPP [mask] and colour head
    mcfg = model.config
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    elif device.type == "cpu" and model.macs() * micro_batch_estimate(cfg, d) * 3 < 2e9:
        torch.set_num_threads(1)
    workers = cfg.workers
    if workers < 0:
        workers = 1 if device.type == "cuda" or (torch.get_num_threads() == 1 and (os.cpu_count() or 1) >= 2) else 0
    net.to(device)
    _seed_all(cfg.seed + d.rank)  # different augmentation per rank
    amp_dtype, use_scaler = _amp(cfg.precision, device)

    micro = r.batch_size // (d.world_size * r.accum_steps)
    if micro < 1 or micro * d.world_size * r.accum_steps != r.batch_size:
        raise ConfigError(
            f"--batch-size {r.batch_size} must be a multiple of processes x --accum-steps = {d.world_size * r.accum_steps}"
        )
    img = mcfg.img_size
    tf_train = train_transform(
        img_size=img,
        mean=mcfg.mean,
        std=mcfg.std,
        in_chans=mcfg.in_chans,
        crop_scale=r.crop_scale,
        crop_ratio=r.crop_ratio,
        hflip=r.hflip,
        randaugment=r.randaugment,
        random_erasing=r.random_erasing,
    )
    tf_eval = eval_transform(img_size=img, mean=mcfg.mean, std=mcfg.std, in_chans=mcfg.in_chans, crop_pct=r.crop_pct)
    train_ds = ArrayDataset(data.train.images, data.train.labels, transform=tf_train, in_chans=mcfg.in_chans)
    shard = eval_shard(data.val, d.rank, d.world_size)
    val_ds = ArrayDataset(shard.images, shard.labels, transform=tf_eval, in_chans=mcfg.in_chans)
    sampler = DistributedSampler(
        train_ds, num_replicas=d.world_size, rank=d.rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    micro_per_epoch = len(sampler) // micro
    steps_per_epoch = micro_per_epoch // r.accum_steps
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {r.batch_size} is larger than the training set ({len(data.train)} images)")
    mix = None if mpp else mix_transform(num_classes=data.num_classes, mixup=r.mixup, cutmix=r.cutmix)
    loader_gen = torch.Generator().manual_seed(cfg.seed + 1000 * d.rank)  # keeps DataLoader seeding off the global RNG

    def train_loader(epoch: int, start_micro: int) -> DataLoader:
        sampler.set_epoch(epoch)
        return DataLoader(
            train_ds,
            batch_size=micro,
            sampler=_SkipSampler(sampler, start_micro * micro, steps_per_epoch * r.accum_steps * micro),
            drop_last=True,
            num_workers=workers,
            generator=loader_gen,
            persistent_workers=False,
        )

    eval_loader = DataLoader(
        val_ds,
        batch_size=max(micro, 256),
        shuffle=False,
        num_workers=workers if device.type == "cuda" else 0,
        generator=loader_gen,
    )
    ddp_model: nn.Module = net
    if d.enabled:  # MPP leaves the ViT's pooling/head path unused
        ddp_model = nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=mpp
        )
    run_model = torch.compile(ddp_model) if cfg.compile else ddp_model

    lr = r.scaled_lr(r.batch_size)
    from .optim import build_optimizer
    from .schedule import build_scheduler

    # -- plan: epochs and steps (a time budget measures a step first) ---------------------
    replan: dict[str, Any] = {
        "due": False
    }  # a time-budgeted run re-measures its real step time once, early (see on_step)
    if state is not None:
        plan = dict(state["plan"])
    else:
        epochs, total_steps = r.epochs, r.epochs * steps_per_epoch
        if cfg.time_budget:
            total_steps, epochs, eval_s = _plan_budget(
                cfg,
                net,
                run_model,
                train_ds,
                val_ds,
                micro,
                steps_per_epoch,
                device,
                amp_dtype,
                t_start,
                d,
                log,
                workers,
            )
            replan.update(eval_s=eval_s, due=total_steps >= 2 * _REPLAN_AT)
        warm = r.warmup_steps or round(r.warmup_epochs * steps_per_epoch)
        if warm > total_steps // 2:
            log(f"note: warmup {warm} steps capped at half the run ({total_steps // 2} steps)")
            warm = total_steps // 2
        epochs, total_steps, warm = broadcast_ints([epochs, total_steps, warm], d, device)  # rank 0's plan for all
        plan = {
            "epochs": epochs,
            "total_steps": total_steps,
            "steps_per_epoch": steps_per_epoch,
            "warmup_steps": warm,
            "lr": lr,
        }
    optimizer = build_optimizer(net, r, lr)
    scheduler = build_scheduler(
        optimizer,
        total_steps=plan["total_steps"],
        warmup_steps=plan["warmup_steps"],
        schedule=r.schedule,
        min_ratio=r.min_lr_ratio,
    )
    scaler = torch.amp.GradScaler(device.type) if use_scaler else None
    ema = None
    if r.ema:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(r.ema), use_buffers=True)

    epoch, step, start_micro, best, wall_before, img_before, train_s_before = 0, 0, 0, -1.0, 0.0, 0, 0.0
    loss_before = 0.0  # the train-loss sum of a partly done epoch (resume)
    if state is not None:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if ema is not None and state.get("ema"):
            ema.load_state_dict(state["ema"])
        epoch, step, start_micro = state["epoch"], state["step"], state["micro_in_epoch"]
        loss_before = state.get("epoch_loss_sum", 0.0)
        best, wall_before = state["best_top1"], state["wall_s"]
        img_before, train_s_before = state["train_images"], state["train_s"]
        set_rng_state(state["rng"])
        torch_states = state.get("torch_rng_ranks")
        if torch_states is not None and d.rank < len(torch_states):
            torch.set_rng_state(torch_states[d.rank])
        loader_gen.set_state(state["loader_rng"])
        if d.is_main:
            truncate_metrics(out / "metrics.jsonl", last_epoch=epoch)
        if step >= plan["total_steps"] or epoch >= plan["epochs"]:
            log(f"{out}: the run is already complete ({step} steps); nothing to resume")
        else:
            log(f"resuming {out} at epoch {epoch + 1}, step {step}/{plan['total_steps']}")
    elif d.is_main:
        (out / "metrics.jsonl").unlink(missing_ok=True)

    n_params = model.num_params()
    log(
        f"training {mcfg.name} ({n_params:,} params, {mcfg.img_size[0]}x{mcfg.img_size[1]} px, patch {mcfg.patch_size}) "
        f"on {data.name}: {len(data.train):,} train / {len(data.val):,} {data.val_name} images, {data.num_classes} classes; "
        f"recipe {r.name}, {plan['epochs']} epochs = {plan['total_steps']} steps of {r.batch_size}, lr {lr:.2g}, "
        f"{d.world_size} process(es) on {device.type}"
    )

    def save_checkpoint(
        ep: int, st: int, micro_done: int, rng: dict[str, Any], torch_ranks: list[torch.Tensor], lg: torch.Tensor
    ) -> None:
        blob = {
            "model": net.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "ema": ema.state_dict() if ema is not None else None,
            "rng": rng,
            "torch_rng_ranks": torch_ranks,
            "loader_rng": lg,
            "epoch": ep,
            "step": st,
            "micro_in_epoch": micro_done,
            "epoch_loss_sum": cur.get("loss_sum", 0.0) if micro_done else 0.0,
            "best_top1": best,
            "plan": plan,
            "wall_s": wall_before + time.perf_counter() - t_start,
            "train_images": img_total,
            "train_s": train_s_total,
            "config": json.dumps(cfg.to_dict()),
            "vitlab_checkpoint": 1,
        }
        atomic_torch_save(blob, out / "last.pt")
        last_saved["step"] = st

    def gather_torch_rng(s: torch.Tensor) -> list[torch.Tensor]:
        if not d.enabled:
            return [s]
        import torch.distributed as tdist

        got = [torch.empty_like(s) for _ in range(d.world_size)]
        tdist.all_gather(got, s) if device.type == "cpu" else tdist.all_gather_object(got, s)
        return got

    bar = tqdm(
        total=plan["total_steps"],
        initial=step,
        unit="step",
        desc="train",
        disable=not (cfg.progress and d.is_main),
        dynamic_ncols=True,
    )
    img_total, train_s_total = img_before, train_s_before
    last_save = last_plot = time.perf_counter()
    steps_this_run = 0
    nan_skipped = 0  # optimizer steps skipped for a NaN/Inf loss in this process (--on-nan skip)
    last_saved: dict[str, int | None] = {"step": state["step"] if state is not None else None}
    interrupted = False
    last_eval: dict[str, Any] | None = None
    prev_sigint = signal.getsignal(signal.SIGINT)
    stop_flag = {"sigint": False}

    def on_sigint(signum, frame):  # finish the current step, then save and stop
        if stop_flag["sigint"]:
            raise KeyboardInterrupt
        stop_flag["sigint"] = True

    if d.is_main and not d.enabled:
        signal.signal(signal.SIGINT, on_sigint)
    eval_model = ema.module if ema is not None else net

    def _replan() -> None:
        """The planning probe times bare steps on a fixed batch; the run's own steps add data loading,
        clipping, the real optimizer and the machine's load of the moment. Re-fit the schedule to the
        measured pace once, still inside the warmup of a long run, so the run ends on time."""
        now = time.perf_counter()
        per_step = (now - replan["t0"]) / (_REPLAN_AT - _REPLAN_FROM) * 1.02
        left = cfg.time_budget - (now - t_start) - _budget_reserve(cfg.time_budget)
        total = step + _steps_in_budget(left, per_step, replan["eval_s"], steps_per_epoch, done=step)
        (total,) = broadcast_ints([total], d, device)
        replan["due"] = False
        if abs(total - plan["total_steps"]) <= 0.02 * plan["total_steps"]:
            return
        log(
            f"\ntime budget: the run's own steps take {per_step * 1000:.0f} ms -> re-planned to {total} steps (was {plan['total_steps']})"
        )
        plan["total_steps"], plan["epochs"] = total, max(1, math.ceil(total / steps_per_epoch))
        scheduler.lr_lambdas[0].total_steps = total  # the cosine now ends at the new last step
        bar.total = total

    try:
        cur: dict[str, Any] = {}  # the epoch in progress, read by on_step

        def on_step(res: EpochResult, loss: float) -> bool:
            nonlocal step, img_total, steps_this_run, last_save
            step += 1
            steps_this_run += 1
            img_total = cur["start_img"] + res.images * d.world_size
            ips = res.images * d.world_size / max(res.seconds, 1e-9)
            bar.update(1)
            bar.set_postfix(
                epoch=f"{epoch + 1}/{plan['epochs']}",
                loss=f"{loss:.3f}",
                img_s=f"{ips:.0f}",
                lr=f"{scheduler.get_last_lr()[0]:.2e}",
            )
            cur["micro"] = cur["start_micro"] + res.micro_batches
            cur["loss_sum"] = cur["start_loss"] + res.loss_sum
            if replan["due"] and steps_this_run == _REPLAN_FROM:
                replan["t0"] = time.perf_counter()
            elif replan["due"] and steps_this_run == _REPLAN_AT:
                _replan()
            stop = step >= plan["total_steps"]
            stop |= cfg.stop_after is not None and steps_this_run >= cfg.stop_after
            flag = torch.tensor([int(stop_flag["sigint"])])
            if d.enabled:
                import torch.distributed as tdist

                tdist.all_reduce(flag)
            stop |= bool(flag.item())
            periodic = cfg.save_every is not None and time.perf_counter() - last_save >= 60 * cfg.save_every
            if (stop or periodic) and cur[
                "micro"
            ] < steps_per_epoch * r.accum_steps:  # mid-epoch: save the exact position
                ranks = gather_torch_rng(torch.get_rng_state())
                if d.is_main:
                    save_checkpoint(epoch, step, cur["micro"], get_rng_state(), ranks, loader_gen.get_state())
                last_save = time.perf_counter()
            return stop

        while epoch < plan["epochs"] and step < plan["total_steps"]:
            cur.update(
                start_img=img_total,
                start_micro=start_micro,
                micro=start_micro,
                start_loss=loss_before,
                loss_sum=loss_before,
            )
            res = train_one_epoch(
                run_model,
                train_loader(epoch, start_micro),
                optimizer=optimizer,
                scheduler=scheduler,
                device=device,
                label_smoothing=r.label_smoothing,
                mix=mix,
                accum_steps=r.accum_steps,
                clip_grad=r.clip_grad,
                amp_dtype=amp_dtype,
                scaler=scaler,
                ema=ema,
                on_step=on_step,
                on_nan=cfg.on_nan,
            )
            nan_skipped += res.skipped
            train_s_total += res.seconds
            epoch_done = (
                not res.stopped or cur["micro"] >= steps_per_epoch * r.accum_steps or step >= plan["total_steps"]
            )
            if not epoch_done:
                interrupted = True
                break
            if mpp:
                last_eval = evaluate_mpp(
                    eval_model, eval_loader, device=device, amp_dtype=amp_dtype, dist=d, seed=cfg.seed
                )
            else:
                last_eval = evaluate(
                    eval_model, eval_loader, num_classes=data.num_classes, device=device, amp_dtype=amp_dtype, dist=d
                )
            row = {
                "epoch": epoch + 1,
                "step": step,
                "train_loss": cur["loss_sum"] / max(cur["micro"], 1),
                "lr": scheduler.get_last_lr()[0],
                "top1": last_eval["top1"],
                "top5": last_eval["top5"],
                "eval_loss": last_eval["loss"],
                "images_per_sec": res.images * d.world_size / max(res.seconds, 1e-9),
                "wall_s": wall_before + time.perf_counter() - t_start,
            }
            if res.skipped:
                row["nan_skipped"] = res.skipped
            improved = last_eval["top1"] > best
            best = max(best, last_eval["top1"])
            epoch += 1
            start_micro, loss_before = 0, 0.0
            bar.set_postfix(
                epoch=f"{epoch}/{plan['epochs']}", top1=f"{100 * row['top1']:.1f}%", loss=f"{row['train_loss']:.3f}"
            )
            ranks = gather_torch_rng(torch.get_rng_state())
            if d.is_main:
                append_metrics(row, out / "metrics.jsonl")
                if improved or cfg.keep == "last":
                    _save_model(unwrap(eval_model), out / "model", cfg, data, last_eval, epoch)
                save_checkpoint(epoch, step, 0, get_rng_state(), ranks, loader_gen.get_state())
                last_save = time.perf_counter()
                if time.perf_counter() - last_plot > 30:  # figures cost ~1 s; the end of the run always draws them
                    _plots(out, data.class_names, last_eval)
                    last_plot = time.perf_counter()
            if res.stopped and step < plan["total_steps"]:
                interrupted = True
                break
    except NonFiniteLossError as e:
        kept = (
            f"{out / 'last.pt'} (step {last_saved['step']}) holds the last good state"
            if last_saved["step"] is not None
            else "no checkpoint was saved yet"
        )
        raise NonFiniteLossError(
            f"{e}, global step {step + 1}: stopped before that update; {kept}. Lower --lr, set --clip-grad, or pass --on-nan skip"
        ) from None
    finally:
        bar.close()
        if d.is_main and not d.enabled:
            signal.signal(signal.SIGINT, prev_sigint)

    from .report import read_metrics

    rows = read_metrics(out / "metrics.jsonl") if d.is_main else []
    wall = wall_before + time.perf_counter() - t_start
    summary = {
        "top1": rows[-1]["top1"] if rows else None,
        "top5": rows[-1]["top5"] if rows else None,
        "best_top1": best if best >= 0 else None,
        "epochs": epoch,
        "steps": step,
        "images_per_sec": img_total / max(train_s_total, 1e-9),
        "wall_s": wall,
        "params": n_params,
        "model": {
            "name": mcfg.name,
            "img_size": list(mcfg.img_size),
            "patch_size": mcfg.patch_size,
            "embed_dim": mcfg.embed_dim,
            "depth": mcfg.depth,
            "num_heads": mcfg.num_heads,
            "mlp_dim": mcfg.mlp_dim,
            "init": cfg.init,
        },
        "data": data.describe(),
        "recipe": r.name,
        "objective": cfg.objective,
        "processes": d.world_size,
        "device": device.type,
        "out": str(out),
        "interrupted": interrupted,
        "nan_skipped": nan_skipped,
        "planned_epochs": plan["epochs"],
        "planned_steps": plan["total_steps"],
    }
    if d.is_main:
        write_json(summary, out / "summary.json")
        if last_eval is not None:
            _plots(out, data.class_names, last_eval)
        if interrupted:
            log(
                f"stopped at epoch {epoch + 1}, step {step}; saved {out / 'last.pt'}. Continue with: vitlab train --out {out} --resume"
            )
    return summary


def _cache_size(cfg: TrainConfig) -> int | None:
    """Folder images of mixed sizes are cached as squares a little larger than the model input."""
    s = cfg.img_size or cfg.recipe.img_size
    return None if s is None else max(32, math.ceil(s / 0.875))


def _save_model(model: nn.Module, path: Path, cfg: TrainConfig, data, ev: dict[str, Any], epoch: int) -> None:
    from ..checkpoints import save

    r = cfg.recipe
    save(
        model,
        path,
        extra={
            "crop_pct": r.crop_pct,
            "recipe": r.name,
            "data": cfg.data,
            "epoch": epoch,
            "top1": ev["top1"],
            "top5": ev["top5"],
            "init": cfg.init,
            "objective": cfg.objective,
        },
    )


def _plots(out: Path, class_names: list[str], ev: dict[str, Any]) -> None:
    from .report import read_metrics

    try:
        plot_curves(read_metrics(out / "metrics.jsonl"), out / "curves.png")
        if "confusion" in ev:  # not for MPP's 512 colours
            plot_confusion(ev["confusion"], class_names, out / "confusion.png")
    except Exception as e:  # a figure must never kill a training run
        print(f"warning: could not draw figures ({type(e).__name__}: {e})", file=sys.stderr)


def _plan_budget(
    cfg, model, run_model, train_ds, val_ds, micro, steps_per_epoch, device, amp_dtype, t_start, d, log, workers
) -> tuple[int, int, float]:
    """``(steps, epochs, seconds per evaluation)`` that fit ``cfg.time_budget``: time a few throw-away
    steps on a copy of the model (so the real run's RNG and weights are untouched), then subtract evaluations.

    With ``--compile`` the steps run through the real compiled model instead (its compilation is
    then paid, and counted, here, and the per-step time is the compiled one), with a zero-LR
    optimizer of its own: a step of AdamW at LR 0 leaves every weight bit-identical."""
    import torch.nn.functional as F

    r = cfg.recipe
    probe = run_model if cfg.compile else copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters() if cfg.compile else probe.parameters(), lr=0.0)
    n_warm, n_time = 2, 5
    with torch.random.fork_rng(devices=[]):
        xs = torch.stack([train_ds[i % len(train_ds)][0] for i in range(micro)]).to(device)
        ys = torch.randint(0, max(1, int(train_ds.labels.max()) + 1), (micro,), device=device)
        probe.train()
        for i in range(n_warm + n_time):
            if i == n_warm:
                t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else torch.enable_grad():
                res = probe(xs)
                loss = F.cross_entropy(res.float(), ys) if isinstance(res, torch.Tensor) else res.loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        step_s = (time.perf_counter() - t0) / n_time * r.accum_steps
        # data loading + augmentation of one step, done in this process when workers=0
        t0 = time.perf_counter()
        for i in range(micro):
            train_ds[i % len(train_ds)]
        aug_s = (time.perf_counter() - t0) * r.accum_steps if workers == 0 else 0.0
        evaluator = model if cfg.compile else probe  # evaluation runs eager: no second compilation for its batch shape
        evaluator.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            n_eval = min(len(val_ds), 256)
            xe = torch.stack([val_ds[i][0] for i in range(n_eval)]).to(device)
            evaluator(xe)
        eval_s = (time.perf_counter() - t0) * len(val_ds) / n_eval
    del probe, opt, evaluator
    per_step = (step_s + aug_s) * 1.03  # a little margin for logging and the bar
    left = cfg.time_budget - (time.perf_counter() - t_start) - _budget_reserve(cfg.time_budget)
    total = _steps_in_budget(left, per_step, eval_s, steps_per_epoch)
    epochs = max(1, math.ceil(total / steps_per_epoch))
    log(
        f"time budget {cfg.time_budget:.0f} s: measured {per_step * 1000:.0f} ms per step "
        f"({r.batch_size / per_step:.0f} img/s incl. augmentation), eval {eval_s:.1f} s -> {total} steps, {epochs} epoch(s)"
    )
    return total, epochs, eval_s


_REPLAN_FROM, _REPLAN_AT = 5, 45
"""A time-budgeted run times its own optimizer steps ``_REPLAN_FROM`` to ``_REPLAN_AT`` and re-plans once from that."""


def _budget_reserve(budget: float) -> float:
    """Seconds kept back from a time budget for the final save and figures."""
    return min(5.0, 0.1 * budget)


def _steps_in_budget(left: float, per_step: float, eval_s: float, steps_per_epoch: int, done: int = 0) -> int:
    """How many more optimizer steps fit in ``left`` seconds after ``done`` steps: ``per_step`` each,
    plus one evaluation (``eval_s``, plus 0.5 s for saving) at the end of every epoch they finish or start."""

    def cost(n: int) -> float:
        return n * per_step + (math.ceil((done + n) / steps_per_epoch) - done // steps_per_epoch) * (eval_s + 0.5)

    n = max(1, int(left / per_step))
    while n > 1 and cost(n) > left:
        n -= 1
    return n
