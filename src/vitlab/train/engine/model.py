"""The model a run trains: fresh from the architecture rule (:func:`~vitlab.train.conf.arch.fresh_config`), or the
``--init`` model adapted for fine-tuning through :func:`vitlab.load`'s overrides (a new resolution: position
embeddings resampled, Sec. 3.2; another ``--patch-size``: the patch projection resized as FlexiViT does, Beyer et
al. 2023; other classes, the same ones in another order or the pre-training MLP head: a new zero-initialised linear
head), with the checkpoint read once. Also its input normalisation, the linear probe's freezing and LP-FT's head-only
phase, the precision and the seeds. How much it gets (its recipe fitted, its threads) is the run's
:class:`~vitlab.train.sizing.Sizing`."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..._units import counted
from ...accel import accelerate
from ...adapters import DEFAULT_TARGETS, apply_tuning, trainable_counts
from ...checkpoints import Checkpoint, checkpoint_config, load
from ...data import ArrayDataset, ImageArray, channel_stats, eval_transform
from ...data.shards.stream import STATS_SAMPLES, StreamData, first_images
from ...distributed import Dist
from ...errors import ConfigError, VitlabError
from ...models import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, VisionTransformer, ViTConfig
from ...models.whiten import whiten_init_
from ...resolve import model_source, read_model
from ..conf.arch import fresh_config, head_choice
from ..conf.options import OptionError, ref
from ..conf.recipes import Recipe
from ..conf.rules import check_init
from ..conf.train_config import TrainConfig
from ..objectives import Objective
from ..sizing.choice import Sizing
from .messages import init_line

if TYPE_CHECKING:
    from ...data.sources import DataSplits

__all__ = [
    "WHITEN_IMAGES",
    "HeadOnly",
    "InitModel",
    "amp",
    "build_model",
    "build_net",
    "input_norm",
    "run_model_config",
    "seed_all",
    "tune_model",
    "whiten_first_conv",
]


@dataclass(frozen=True)
class InitModel:
    """The ``--init`` checkpoint, read once before the data (its architecture is checked against the options);
    ``config``: what it states."""

    path: str
    checkpoint: Checkpoint
    config: ViTConfig

    @classmethod
    def read(cls, cfg: TrainConfig) -> InitModel | None:
        """The run's ``--init`` checkpoint, checked against its options (None without ``--init``). A checkpoint that
        does not state its head count (a bare state dict: :func:`~vitlab.checkpoints.infer.guess_num_heads`) takes
        ``--heads`` for it, as ``vitlab convert`` takes ``--num-heads``."""
        if not cfg.init:
            return None
        try:  # the one model rule (vitlab.resolve): a run folder is its model/; an architecture or export refused
            ckpt = read_model(model_source(cfg.init, option="--init", trained=True), option="--init")
        except VitlabError as e:
            if getattr(e, "problem", None) is None:  # the checkpoint's own error names its file
                raise
            raise OptionError(ref("init"), f" {cfg.init}: {e.problem}") from None
        heads = cfg.arch.get("num_heads")
        if heads and ckpt.config is None and "num_heads" not in ckpt.fields:  # no shape tells it: --heads does
            ckpt = dataclasses.replace(ckpt, fields={**ckpt.fields, "num_heads": heads})
        have = checkpoint_config(ckpt)
        check_init(cfg, have)
        return cls(cfg.init, ckpt, have)

    def overrides(
        self, cfg: TrainConfig, recipe: Recipe, *, num_classes: int, class_names: list[str]
    ) -> dict[str, Any]:
        """What fine-tuning with ``recipe`` changes in the checkpoint's model (:func:`vitlab.load`'s overrides)."""
        r = recipe
        patch = cfg.arch.get("patch_size")
        img = cfg.img_size or r.img_size
        return {
            "num_classes": num_classes,
            "head": "linear",
            "representation_size": None,
            "class_names": list(class_names),
            "drop_path_rate": r.drop_path,
            "drop_rate": r.dropout,
            "patch_drop_rate": 0.0 if cfg.pack else r.token_drop,  # --pack: dropped per image before packing
            "img_size": img or self.config.img_size,  # always given: a processor's other side no longer applies
            **({"patch_size": patch} if patch and patch != self.config.patch_size else {}),
        }

    def build(
        self, cfg: TrainConfig, recipe: Recipe, *, num_classes: int, class_names: list[str]
    ) -> tuple[nn.Module, str]:
        """``(the fine-tuned model, the line saying what it started from)``. The pre-trained head is kept only for
        the same classes in the same order (:func:`~vitlab.train.conf.arch.head_choice`); otherwise the
        checkpoint's head is left out, so :func:`vitlab.load` makes a zero-initialised one."""
        changes = self.overrides(cfg, recipe, num_classes=num_classes, class_names=class_names)
        new_head, why = head_choice(self.config, class_names, new_head=cfg.new_head)
        ckpt = self.checkpoint
        if new_head:
            state = {k: v for k, v in ckpt.state.items() if not k.startswith(("head.", "head_dist."))}
            ckpt = dataclasses.replace(ckpt, state=state)
        try:
            model = accelerate(load(ckpt, **changes))
        except VitlabError as e:
            raise OptionError(ref("init"), f" {self.path}: weights do not fit the model ({e})") from None
        old, new = self.config, model.config
        line = init_line(self.path, old, new, new_head=new_head, why=why)
        if "patch_size" in changes:
            p, q = old.patch_size, new.patch_size
            line += f"; patch projection resized {p}x{p} -> {q}x{q} (FlexiViT)"
        return model, line


def build_model(
    cfg: TrainConfig,
    *,
    num_classes: int,
    in_chans: int,
    image_size: tuple[int, int],
    class_names: list[str],
    norm: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
    recipe: Recipe | None = None,
) -> nn.Module:
    """The run's model: fresh from ``recipe`` (None: the config's) / name / options (``norm``: the input
    ``(mean, std)``, see :func:`input_norm`; None: the config's), or the ``--init`` model adapted for fine-tuning
    (:class:`InitModel`)."""
    r = recipe or cfg.recipe
    init = InitModel.read(cfg)
    if init is not None:
        return init.build(cfg, r, num_classes=num_classes, class_names=class_names)[0]
    c = fresh_config(cfg, recipe=r, image_size=image_size, in_chans=in_chans, num_classes=num_classes,
                     class_names=class_names, norm=norm)  # fmt: skip
    return accelerate(VisionTransformer(c))


def run_model_config(
    cfg: TrainConfig, recipe: Recipe, data: DataSplits, *, objective: type[Objective], init: InitModel | None
) -> ViTConfig:
    """The configuration of the run's model with ``recipe`` before it is built (the architecture, computed once:
    :attr:`~vitlab.train.sizing.Sizing.model`), so that the run's memory is estimated before anything big is
    allocated (a fresh model's from the options, an ``--init`` model's from its file)."""
    n, names = objective.head(data)
    if init is not None:
        return checkpoint_config(init.checkpoint, **init.overrides(cfg, recipe, num_classes=n, class_names=names))
    return fresh_config(cfg, recipe=recipe, image_size=data.image_size, in_chans=data.in_chans, num_classes=n,
                        class_names=names)  # fmt: skip


def input_norm(cfg: TrainConfig, data: DataSplits) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The input ``(mean, std)`` of a model trained from scratch (``--norm-stats``; None: the model's own).

    By default the training set's per-channel statistics, as timm's and DeiT's CIFAR scripts normalise: inputs
    of unit variance train faster than Google's 0.5 / 0.5 scaling, which leaves them at about half that
    (docs/speedrun.md). Tar-shard data, whose images are not at hand before training, by the same rule over its
    first :data:`~vitlab.data.shards.stream.STATS_SAMPLES` training samples
    (:func:`~vitlab.data.shards.stream.first_images`). A fine-tuned ``--init`` model keeps its own normalisation."""
    if cfg.init:
        return None
    if cfg.norm_stats == "inception":
        return INCEPTION_MEAN, INCEPTION_STD
    if cfg.norm_stats == "imagenet":
        return IMAGENET_MEAN, IMAGENET_STD
    train = getattr(data, "train", None)
    if data.in_chans not in (1, 3):
        return None  # the config holds three values: one channel is stored repeated, others keep the defaults
    if isinstance(data, StreamData):
        side = data.image_size
        images = first_images(data.train, STATS_SAMPLES, at_least=(side[1], side[0]))
    else:
        images = train.images if isinstance(train, ImageArray) else []
    if len(images) == 0:
        return None
    mean, std = channel_stats(images, in_chans=data.in_chans)
    return (mean * 3, std * 3) if data.in_chans == 1 else (mean, std)


def build_net(
    cfg: TrainConfig, sizing: Sizing, data: DataSplits, *, objective: Objective, init: InitModel | None, dist: Dist,
    device: torch.device,
) -> tuple[nn.Module, str | None]:  # fmt: skip
    """``(net, init line)``: the module the optimiser trains (the ViT inside the objective's module) on ``device``,
    of the architecture the sizing chose (:attr:`~vitlab.train.sizing.Sizing.model`, with the input normalisation
    of :func:`input_norm`), and what fine-tuning started from (None: a fresh model).

    The weights are drawn from ``cfg.seed`` (the same on every rank); afterwards the global generators are
    re-seeded per rank so that each process augments differently."""
    seed_all(cfg.seed)
    n, names = objective.head(data)
    r = sizing.recipe
    line = None
    if init is not None:
        model, line = init.build(cfg, r, num_classes=n, class_names=names)
    else:
        norm = input_norm(cfg, data)
        mc = sizing.model or run_model_config(cfg, r, data, objective=type(objective), init=None)
        model = accelerate(VisionTransformer(mc.replace(mean=norm[0], std=norm[1]) if norm else mc))
    if r.whiten_init:
        whiten_first_conv(model, data, seed=cfg.seed, crop_pct=r.crop_pct)
    if cfg.distill_token:  # training forwards return (class logits, distillation logits) for the DeiT loss
        model.set_distilled_training(True)
    if r.tuning == "head":
        _freeze_all_but_head(model)
    elif r.tuning != "full":
        tuning = tune_model(model, r)
        line = f"{line}; {tuning}" if line else tuning
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    net = objective.wrap(model)
    net.to(device)
    seed_all(cfg.seed + dist.rank)
    return net, line


WHITEN_IMAGES = 2048
"""The most training images ``--whiten-init`` reads (airbench whitens from 5,000; the covariance of a first layer's
few dozen input values is well estimated from far fewer patches)."""


def whiten_first_conv(model: nn.Module, data: DataSplits, *, seed: int, crop_pct: float) -> int:
    """``--whiten-init``: set ``model``'s first convolution (``pretrained_cfg["first_conv"]``: the patch embedding, or
    the conv stem's first layer, whose ReLU takes the negated filters too) to whiten its input patches
    (:func:`~vitlab.models.whiten.whiten_init_`) in up to :data:`WHITEN_IMAGES` training images as the model sees
    them (the evaluation transform: resized, normalised), drawn from ``seed`` by a generator of their own: the
    same images and filters for the same seed, and the global generators untouched. Returns the filters set."""
    train = getattr(data, "train", None)
    if not isinstance(train, ImageArray) or len(train) == 0:
        raise OptionError(ref("recipe.whiten_init"), " reads training images before training, and tar shards are "
                          "streamed; give an image folder, or drop the flag")  # fmt: skip
    c = model.config
    tf = eval_transform(img_size=c.img_size, mean=c.mean, std=c.std, in_chans=c.in_chans, crop_pct=crop_pct)
    images = ArrayDataset(train.images, train.labels, transform=tf, in_chans=c.in_chans)
    picked = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:WHITEN_IMAGES].sort().values
    x = torch.stack([images[int(i)][0] for i in picked])
    conv = model.get_submodule(model.pretrained_cfg["first_conv"])
    return whiten_init_(conv, x, negated=c.stem == "conv")


def tune_model(model: nn.Module, recipe: Recipe) -> str:
    """Make ``model`` train by the recipe's parameter-efficient method (``--tune lora|ssf|bias``, ``--lora R``:
    :func:`vitlab.adapters.apply_tuning`), in place, before the optimizer sees it; the line saying what trains
    (how many parameters, and their share of the model). The wrapping draws LoRA's ``A`` from the global generator,
    seeded before it, so a resumed run rebuilds the same adapters before ``last.pt``'s values replace them."""
    r = recipe
    t = r.tuning
    targets = r.lora_targets or DEFAULT_TARGETS
    path = "recipe.lora_targets" if r.lora_targets else ("recipe.lora" if r.tune is None else "recipe.tune")
    try:
        n = apply_tuning(model, t, rank=r.lora_rank, alpha=r.lora_alpha, targets=targets)
    except ConfigError as e:
        raise OptionError(ref(path), f": {e}") from None
    trained, total = trainable_counts(model)
    what = {
        "lora": f"LoRA r={r.lora_rank}, alpha={r.lora_alpha or r.lora_rank:g} on {n} linears "
        f"({','.join(targets)}; merged into model/)",
        "ssf": f"SSF after {n} layers ({','.join(targets)} and the LayerNorms; merged into model/)",
        "bias": f"bias-only (BitFit: {n} bias tensors)",
    }[t]
    return (
        f"{what}: {trained:,} of {total:,} parameters train ({100 * trained / max(total, 1):.2f}%, the head included)"
    )


def _freeze_all_but_head(model: nn.Module) -> None:
    """A linear probe: only the classifier head (``head.*``) keeps ``requires_grad``; every other
    parameter is left out of the optimiser and so stays bit-identical through training."""
    if getattr(model, "head", None) is None or not any(True for _ in model.head.parameters()):
        raise OptionError(ref("recipe.freeze"), " trains only the classifier head, and this model has none")
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))


@dataclass(kw_only=True)
class HeadOnly:
    """LP-FT's head-only phase (``--head-warmup``): the non-head parameters that were trainable are held back
    (``requires_grad`` off) until :meth:`release`. The optimizer was built with them, so nothing is rebuilt: while
    held back they get no gradient, and torch's optimizers skip a parameter without one (no update, no weight
    decay, no state), so they stay bit-identical."""

    held: list[nn.Parameter]
    what: str
    """What trains once they are released, in words (every weight; under ``--tune lora`` the adapters and the head)."""

    @classmethod
    def hold(cls, model: nn.Module, *, distributed: bool, what: str) -> HeadOnly:
        """Hold ``model``'s non-head parameters back (one process: DDP registers the trainable parameters once);
        ``what``: :meth:`~vitlab.train.conf.recipes.Recipe.tuning_what`."""
        if distributed:
            raise OptionError(ref("recipe.head_warmup"), " runs in one process; under torchrun use ",
                              ref("recipe.freeze"), ", then fine-tune")  # fmt: skip
        if getattr(model, "head", None) is None or not any(True for _ in model.head.parameters()):
            raise OptionError(ref("recipe.head_warmup"), " trains only the classifier head first, and this model "
                              "has none")  # fmt: skip
        held = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("head.")]
        for p in held:
            p.requires_grad_(False)
        return cls(held=held, what=what)

    def release(self, step: int) -> str:
        """Train the held parameters again from ``step`` on; the line that says so."""
        for p in self.held:
            p.requires_grad_(True)
        return f"head warmup done after {counted(step, 'step')}: training {self.what} from here"


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def amp(precision: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """``--precision`` on ``device`` -> ``(autocast dtype or None for float32, whether a GradScaler is needed)``.

    float16 is refused on the CPU here, before any data is read, rather than at the first
    forward pass (:func:`vitlab.devices.autocast` has no CPU float16)."""
    if precision == "auto":
        return (torch.bfloat16 if device.type == "cuda" else None), False
    if precision == "fp16" and device.type != "cuda":
        raise OptionError(ref("precision"), f" fp16 is for CUDA; use bf16 or fp32 on {device.type}")
    return {"fp32": (None, False), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, True)}[precision]
