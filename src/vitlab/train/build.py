"""What a run trains with: the model (fresh, or adapted from ``--init`` for fine-tuning), its
objective wrapper, DDP and ``torch.compile`` around it, CPU threads and DataLoader workers, the
precision, and the optimizer, schedule, gradient scaler and EMA."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from .config import TrainConfig
from .distributed import Dist
from .objectives import Objective
from .recipes import Recipe
from .token_drop import ends_dropping

if TYPE_CHECKING:
    from torch.optim.swa_utils import AveragedModel

    from ..data.sources import DataSplits
    from ..models import ViTConfig

__all__ = [
    "HeadWarmup",
    "Optimization",
    "build_model",
    "build_net",
    "build_optimization",
    "distribute",
    "freeze_all_but_head",
    "fresh_config",
    "input_norm",
    "micro_batch_estimate",
    "planned_config",
]


def build_model(
    cfg: TrainConfig,
    *,
    num_classes: int,
    in_chans: int,
    image_size: tuple[int, int],
    class_names: list[str],
    norm: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> nn.Module:
    """A fresh model from the recipe / name / overrides, or the ``init`` model adapted for
    fine-tuning: new resolution (position embeddings resampled, Sec. 3.2), another ``--patch-size``
    (the patch projection resized as FlexiViT does, Beyer et al. 2023, through :func:`vitlab.load`) and,
    when the classes differ or the pre-training MLP head is present, a new zero-initialised linear head.
    ``norm``: the input ``(mean, std)`` of a fresh model (:func:`input_norm`); the config's when None."""
    from ..accel import accelerate
    from ..models import VisionTransformer

    r = cfg.recipe
    if cfg.init:
        import vitlab

        base: nn.Module = vitlab.load(cfg.init)
        patch, old_patch = cfg.arch.get("patch_size"), base.config.patch_size
        if patch and patch != old_patch:  # FlexiViT's resize of the projection, position embeddings to the new grid
            base = vitlab.load(cfg.init, patch_size=patch)
        old = base.config
        img = cfg.img_size or r.img_size or old.img_size
        new_head = old.num_classes != num_classes or old.head != "linear"
        if cfg.distill_token and not old.dist_token:
            raise ConfigError(
                f"--distill-token: the --init model {cfg.init} has no distillation token; drop the flag "
                "(the class head then takes the teacher's target)"
            )
        new = old.replace(
            img_size=img,
            num_classes=num_classes,
            head="linear",
            representation_size=None,
            class_names=list(class_names),
            drop_path_rate=r.drop_path,
            drop_rate=r.dropout,
            patch_drop_rate=r.token_drop,
        )
        model = type(base)(new) if isinstance(base, VisionTransformer) else VisionTransformer(new)
        state = base.state_dict()
        if new_head:
            state = {k: v for k, v in state.items() if not k.startswith(("head.", "pre_logits."))}
        missing, unexpected = model.load_state_dict(state, strict=False)
        bad = [k for k in missing if not k.startswith("head.")] + list(unexpected)
        if bad:
            raise ConfigError(f"--init {cfg.init}: weights do not fit the model ({', '.join(bad[:4])} ...)")
        from .report import init_line

        model.init_line = init_line(cfg.init, old, new, new_head=new_head)  # printed when the run starts
        if patch and patch != old_patch:
            model.init_line += f"; patch projection resized {old_patch}x{old_patch} -> {patch}x{patch} (FlexiViT)"
        return model

    c = fresh_config(
        cfg, num_classes=num_classes, in_chans=in_chans, image_size=image_size, class_names=class_names, norm=norm
    )
    return accelerate(VisionTransformer(c))


def fresh_config(
    cfg: TrainConfig,
    *,
    num_classes: int,
    in_chans: int,
    image_size: tuple[int, int],
    class_names: list[str],
    norm: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> ViTConfig:
    """The configuration of the fresh model :func:`build_model` builds (no ``--init``), from the recipe, the
    name and the overrides; nothing is allocated, so the run's memory can be estimated first."""
    from ..models import ViTConfig, model_config
    from ..models.config import mlp_dim_for

    r = cfg.recipe
    name = cfg.model or r.model
    base_cfg = model_config(name) if name else ViTConfig(name="vit_custom", **r.arch)
    if not name and r.arch:
        base_cfg = base_cfg.replace(**r.arch)
    arch = dict(cfg.arch)
    ratio = arch.pop("mlp_ratio", None) or base_cfg.mlp_dim / base_cfg.embed_dim
    changes = {k: v for k, v in arch.items() if v is not None}
    if "embed_dim" in changes or cfg.arch.get("mlp_ratio"):
        changes["mlp_dim"] = mlp_dim_for(changes.get("embed_dim", base_cfg.embed_dim), ratio)
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
        patch_drop_rate=r.token_drop,
        class_names=list(class_names),
        **({"mean": norm[0], "std": norm[1]} if norm else {}),
    )
    if cfg.distill_token and not c.dist_token:
        if c.pool != "cls" or c.head != "linear" or not c.class_token:
            raise ConfigError(
                f"--distill-token: DeiT's distillation token needs a class token, --pool cls and a linear head "
                f"(this model: pool {c.pool}, head {c.head}); add --pool cls"
            )
        c = c.replace(dist_token=True)
    if custom:  # e.g. vit_p4_d128_l6, or vit_r_p1_d128_l6 for a hybrid (ResNet stem) like vit_r_ti16
        stem = "" if c.hybrid_layers is None else "r" + "".join(str(n) for n in c.hybrid_layers) + "_"
        c = c.replace(name=f"vit_{stem}p{c.patch_size}_d{c.embed_dim}_l{c.depth}")
    return c


def input_norm(cfg: TrainConfig, data: DataSplits) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The input ``(mean, std)`` of a model trained from scratch (``--norm-stats``; None: the model's own).

    By default the training set's per-channel statistics, as timm's and DeiT's CIFAR scripts normalise: inputs
    of unit variance train faster than Google's 0.5 / 0.5 scaling, which leaves them at about half that
    (docs/speedrun.md). A fine-tuned ``--init`` model keeps its own normalisation, and so does tar-shard data,
    whose images are not at hand before training."""
    from ..data import ImageArray, channel_stats
    from ..models import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD

    if cfg.init:
        return None
    if cfg.norm_stats == "inception":
        return INCEPTION_MEAN, INCEPTION_STD
    if cfg.norm_stats == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    train = getattr(data, "train", None)
    if not isinstance(train, ImageArray) or len(train) == 0 or data.in_chans not in (1, 3):
        return None  # the config holds three values: one channel is stored repeated, others keep the defaults
    mean, std = channel_stats(train.images, in_chans=data.in_chans)
    return (mean * 3, std * 3) if data.in_chans == 1 else (mean, std)


def freeze_all_but_head(model: nn.Module) -> None:
    """A linear probe: only the classifier head (``head.*``) keeps ``requires_grad``; every other
    parameter is left out of the optimiser and so stays bit-identical through training."""
    if getattr(model, "head", None) is None or not any(True for _ in model.head.parameters()):
        raise ConfigError("--freeze trains only the classifier head, and this model has none")
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))


@dataclass(kw_only=True)
class HeadWarmup:
    """``--head-warmup STEPS`` (LP-FT): the non-head parameters that were trainable are held back
    (``requires_grad`` off) until optimizer step ``steps``, then released. The optimizer was built with
    them, so nothing is rebuilt: while held back they get no gradient, and torch's optimizers skip a
    parameter without one (no update, no weight decay, no state), so they stay bit-identical."""

    steps: int
    held: list[nn.Parameter]

    @classmethod
    def start(cls, model: nn.Module, *, steps: int, step: int, distributed: bool) -> HeadWarmup | None:
        """Hold ``model``'s non-head parameters back when the run (now at optimizer step ``step``) is
        still inside the ``steps`` head-only steps; None when there is nothing to hold back."""
        if steps <= 0 or step >= steps:
            return None
        if distributed:  # DDP registers the trainable parameters once, when it wraps the model
            raise ConfigError("--head-warmup runs in one process; under torchrun use --freeze, then fine-tune")
        if getattr(model, "head", None) is None or not any(True for _ in model.head.parameters()):
            raise ConfigError("--head-warmup trains only the classifier head first, and this model has none")
        held = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
        for p in held:
            p.requires_grad_(False)
        return cls(steps=steps, held=held)

    def after_step(self, step: int) -> bool:
        """Release the held parameters once optimizer step ``step`` ends the head-only steps; True then."""
        if step != self.steps:
            return False
        for p in self.held:
            p.requires_grad_(True)
        return True


def micro_batch_estimate(cfg: TrainConfig, d: Dist) -> int:
    """Images per forward pass on one process, before the batch size is checked to divide evenly."""
    return max(1, cfg.recipe.batch_size // (d.world_size * cfg.recipe.accum_steps))


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _amp(precision: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """``--precision`` on ``device`` -> ``(autocast dtype or None for float32, whether a GradScaler is needed)``.

    float16 is refused on the CPU here, before any data is read, rather than at the first
    forward pass (:func:`vitlab.devices.autocast` has no CPU float16)."""
    if precision == "auto":
        return (torch.bfloat16 if device.type == "cuda" else None), False
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(f"--precision fp16 is for CUDA; use bf16 or fp32 on {device.type}")
    return {"fp32": (None, False), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, True)}[precision]


def planned_config(cfg: TrainConfig, *, data: DataSplits, objective: Objective) -> tuple[ViTConfig, nn.Module | None]:
    """``(configuration, model or None)`` of the run's model before :func:`build_net`: a fresh model's
    configuration is computed (:func:`fresh_config`; nothing is allocated, so the run's memory is estimated
    first); an ``--init`` model's is in its file, so that model is loaded (from ``cfg.seed``) and returned for
    :func:`build_net` to use."""
    n_cls, names = objective.head(data)
    kw = {"num_classes": n_cls, "in_chans": data.in_chans, "image_size": data.image_size, "class_names": names}
    if not cfg.init:
        return fresh_config(cfg, **kw), None
    seed_all(cfg.seed)
    model = build_model(cfg, **kw)
    return model.config, model


def build_net(
    cfg: TrainConfig,
    *,
    data: DataSplits,
    dist: Dist,
    device: torch.device,
    objective: Objective,
    model: nn.Module | None = None,
) -> tuple[nn.Module, nn.Module, int]:
    """``(model, net, workers)``: the ViT, the module the optimiser trains (the ViT, or the ViT plus the
    MPP [mask] embedding and colour head) on ``device``, and the number of DataLoader workers.

    The weights are drawn from ``cfg.seed`` (the same on every rank); afterwards the global generators are
    re-seeded per rank so that each process augments differently. The CPU thread count is set here
    because it depends on the model's size and decides the default number of workers. ``model``: the
    ``--init`` model :func:`planned_config` loaded (None: built here)."""
    seed_all(cfg.seed)
    if model is None:
        n_cls, names = objective.head(data)
        model = build_model(
            cfg,
            num_classes=n_cls,
            in_chans=data.in_chans,
            image_size=data.image_size,
            class_names=names,
            norm=input_norm(cfg, data),
        )
    if cfg.distill_token:  # training forwards return (class logits, distillation logits) for the DeiT loss
        model.set_distilled_training(True)
    if cfg.recipe.freeze:
        freeze_all_but_head(model)
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    net = objective.wrap(model)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    elif device.type == "cpu" and model.macs() * micro_batch_estimate(cfg, dist) * 3 < 2e9:
        torch.set_num_threads(1)
    workers = cfg.workers
    if workers < 0:
        spare_cores = torch.get_num_threads() == 1 and (os.cpu_count() or 1) >= 2
        workers = 1 if device.type == "cuda" or spare_cores else 0
    net.to(device)
    seed_all(cfg.seed + dist.rank)
    return model, net, workers


def distribute(
    net: nn.Module,
    cfg: TrainConfig,
    *,
    dist: Dist,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    blocks: list[nn.Module] | None = None,
    unused: bool = False,
) -> nn.Module:
    """The module the training steps call: ``net`` sharded in place with ``--fsdp``
    (:func:`vitlab.train.fsdp.shard`; ``amp_dtype`` picks its precision), else inside
    DistributedDataParallel when there are several processes; compiled with ``--compile``."""
    run_model: nn.Module = net
    if cfg.fsdp:
        from .fsdp import shard

        run_model = shard(net, device=device, amp_dtype=amp_dtype, blocks=blocks)
    elif dist.enabled:  # ``unused``: the objective leaves parameters without gradients (MPP: the ViT's head)
        run_model = nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None, find_unused_parameters=unused
        )
    if not cfg.compile:
        return run_model
    # a resolution schedule changes the input size once or twice, ending token dropping the sequence length once:
    # one static graph per shape, since inductor's symbolic-shape code generation did not finish for the hybrid
    # stem's backward (docs/speedrun.md)
    return torch.compile(run_model, dynamic=False if cfg.recipe.res_schedule or ends_dropping(cfg.recipe) else None)


@dataclass(kw_only=True)
class Optimization:
    """The objects that change the weights, each with its own state in ``last.pt``."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler | None
    ema: AveragedModel | None

    def set_total_steps(self, total: int, *, warmup_steps: int | None = None) -> None:
        """Stretch or shrink the schedule so that it ends at optimizer step ``total`` (and, when given, its
        warmup ends at ``warmup_steps``); every parameter group follows the same schedule."""
        for f in self.scheduler.lr_lambdas:
            f.total_steps = total
            if warmup_steps is not None:
                f.warmup_steps = warmup_steps


def build_optimization(
    net: nn.Module,
    *,
    recipe: Recipe,
    lr: float,
    total_steps: int,
    warmup_steps: int,
    device: torch.device,
    use_scaler: bool,
) -> Optimization:
    """Optimizer at peak ``lr``, its LR schedule over ``total_steps``, a GradScaler for float16, the recipe's EMA."""
    from .optim import build_optimizer
    from .schedule import build_scheduler

    optimizer = build_optimizer(net, recipe, lr)
    scheduler = build_scheduler(
        optimizer,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        schedule=recipe.schedule,
        min_ratio=recipe.min_lr_ratio,
    )
    ema = None
    if recipe.ema:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(recipe.ema), use_buffers=True)
    scaler = torch.amp.GradScaler(device.type) if use_scaler else None
    return Optimization(optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema)
