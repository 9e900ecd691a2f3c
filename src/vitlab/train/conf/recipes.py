"""Named training recipes: documented presets with their source and expected result.

A recipe is a plain dataclass (JSON round-trip); every ``vitlab train`` flag overrides
one of its fields. The learning rate is given for ``base_batch`` and scaled linearly
with the actual (global) batch size, as in the paper's and big_vision's configs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from .kinds import check_res_schedule
from .options import OptionError, Ref

__all__ = [
    "LIMITS",
    "LORA_RANK",
    "RANDAUGMENT_BINS",
    "RANDAUGMENT_OPS",
    "RECIPES",
    "TUNE_METHODS",
    "Recipe",
    "get_recipe",
    "list_recipes",
]

RANDAUGMENT_BINS = 31
"""torchvision's ``RandAugment`` magnitude bins: a magnitude is 0..30 (the paper's scale); a larger one indexed past
its table (``IndexError`` in a data loader)."""
RANDAUGMENT_OPS = 16
"""The most RandAugment operations an image takes (torchvision has 14 kinds; the paper uses 1-3)."""

TUNE_METHODS = ("full", "head", "lora", "ssf", "bias")
"""What fine-tuning trains (``--tune``; :attr:`Recipe.tuning`): every weight, the head alone (a linear probe), LoRA's
low-rank updates of the block linears, SSF's scales and shifts, or the biases (BitFit); :mod:`vitlab.adapters`."""
LORA_RANK = 8
"""LoRA's rank with ``--tune lora`` and no ``--lora R``: ``peft``'s ``LoraConfig`` default ``r=8``."""

LIMITS = {"--img-size": 16384, "--batch-size": 1 << 24, "--devices": 1 << 20, "--accum-steps": 1 << 20}
"""The largest value a run's recipe (:meth:`Recipe.validate`) and ``vitlab plan``
(:func:`vitlab.train.sizing.capacity.check_capacity_numbers`) take for each size: beyond any ViT training run (the
paper's largest batch is 4096 at 224-518 px); a bigger number is a typo, and planning it would print astronomical
figures (or hang)."""


@dataclass
class Recipe:
    """Everything that defines how a model is trained, apart from the data and the run's paths."""

    name: str
    source: str = ""
    """Where the numbers come from."""
    expected: str = ""
    """What result to expect, and at what cost."""
    # -- model -------------------------------------------------------------------
    model: str | None = None
    """A registered name (``vit_ti16``); ``None``: the ``arch`` fields alone."""
    arch: dict[str, Any] = field(default_factory=dict)
    """:class:`~vitlab.ViTConfig` fields (``embed_dim``, ``depth``, ``patch_size`` ...)."""
    img_size: int | None = None
    """Training resolution; ``None``: the data's own size."""
    head: str = "linear"
    drop_path: float = 0.0
    dropout: float = 0.0
    res_schedule: tuple[tuple[int, float], ...] | None = None
    """Progressive resolution: ``((size, end fraction), ...)``, e.g. ``((24, 0.5), (32, 1.0))``: 24 px for the
    first half of the steps, then 32 (:class:`vitlab.train.engine.schedule.StepSchedule`); ``None``: one size
    throughout."""
    token_drop: float = 0.0
    """Training only: the fraction of patch tokens each image drops (PatchDropout, Liu et al. 2022; FLIP,
    Li et al. 2023): the model's ``patch_drop_rate``; evaluation sees every token."""
    token_drop_until: float = 1.0
    """With ``token_drop``: the fraction of the planned optimizer steps that drop tokens; the rest train on every
    token (FLIP's unmasked tuning, :class:`vitlab.train.engine.schedule.StepSchedule`). 1: dropping throughout."""
    # -- optimisation ------------------------------------------------------------
    optimizer: str = "adamw"
    """``adamw``, ``adam``, ``sgd``, or ``muon``: ``torch.optim.Muon`` for the encoder blocks' matrices and AdamW
    for the rest (:func:`vitlab.optim_groups.muon_split`), both on the one LR schedule."""
    lr: float = 1e-3
    base_batch: int | None = None
    """``lr`` is for this batch size (scaled linearly); ``None``: no scaling."""
    batch_size: int = 128
    weight_decay: float = 0.05
    momentum: float = 0.9
    betas: tuple[float, float] = (0.9, 0.999)
    epochs: int = 100
    warmup_epochs: float = 0.0
    warmup_steps: int = 0
    """Takes precedence over ``warmup_epochs`` when > 0 (capped at half the run)."""
    warmup_fraction: float = 0.0
    """Warmup as a fraction of the planned steps, used when ``warmup_steps`` and ``warmup_epochs`` are 0; a
    ``--time-budget`` re-plan keeps the fraction, so that warmup and decay stay in proportion."""
    schedule: str = "cosine"
    min_lr_ratio: float = 0.0
    clip_grad: float | None = 1.0
    accum_steps: int = 1
    ema: float | None = None
    """EMA decay of the weights (evaluated and saved instead of the raw weights), or ``None``."""
    layer_decay: float | None = None
    """Layer-wise LR decay (BEiT, Bao et al. 2022; timm ``--layer-decay``): block ``i`` of ``L`` trains at
    ``layer_decay ** (L - i)`` times the LR, the embeddings at ``layer_decay ** (L + 1)``, the head at 1."""
    freeze: bool = False
    """Train the head only (a linear probe): every other parameter keeps its initial value."""
    tune: str | None = None
    """What fine-tuning trains (:data:`TUNE_METHODS`); None: decided by ``lora`` and ``freeze`` (:attr:`tuning`)."""
    lora: int = 0
    """LoRA's rank R (``--lora R``, implies ``tune`` lora); 0: none (``tune`` lora alone: :data:`LORA_RANK`)."""
    lora_alpha: float | None = None
    """LoRA's alpha: the updates are scaled by ``alpha / R``; None: R (a scale of 1, ``peft``'s default pair)."""
    lora_targets: tuple[str, ...] | None = None
    """The encoder blocks' linears LoRA and SSF adapt, named as ``peft``'s ``target_modules``; None: all four
    (:data:`vitlab.adapters.DEFAULT_TARGETS`)."""
    head_warmup: int = 0
    """LP-FT (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"): the first ``head_warmup``
    optimizer steps train the head only, the rest of the run trains everything."""
    whiten_init: bool = False
    """Before training, the first convolution whitens the patches of a sample of training images
    (:func:`vitlab.models.whiten.whiten_init_`; hlb-CIFAR10, airbench)."""
    mpp_warmup: float = 0.0
    """A masked-patch-prediction warm start (Sec. 4.6) for this fraction of the planned steps, on the same images;
    classification for the rest (:class:`vitlab.train.objectives.warmstart.WarmStart`). 0: none."""
    # -- data and loss -----------------------------------------------------------
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    randaugment: tuple[int, int] | None = None
    """``(num_ops, magnitude)`` of RandAugment, or ``None``."""
    random_erasing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    label_smoothing: float = 0.0
    crop_pct: float = 1.0
    """Eval: resize to ``img_size / crop_pct`` then center crop."""
    tta: str = "none"
    """Eval: ``flip`` averages the logits of each image and its mirror (:func:`vitlab.evaluate.accuracy.tta_logits`)
    in every evaluation, ``flip-last`` in the run's last one only."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self.crop_scale = tuple(self.crop_scale)  # type: ignore[assignment]
        self.crop_ratio = tuple(self.crop_ratio)  # type: ignore[assignment]
        if self.randaugment is not None:
            self.randaugment = tuple(self.randaugment)  # type: ignore[assignment]
        if self.lora_targets is not None:
            self.lora_targets = tuple(self.lora_targets)  # type: ignore[assignment]
        if self.res_schedule is not None:
            try:
                self.res_schedule = check_res_schedule(self.res_schedule)
            except ValueError as e:
                raise OptionError(Ref("recipe.res_schedule"), f": {e}") from None
        self.validate()

    def validate(self) -> None:
        def bad(opt: str, msg: str) -> None:
            raise OptionError(Ref(f"recipe.{opt}"), f": {msg}")

        if self.optimizer not in ("adamw", "adam", "sgd", "muon"):
            bad("optimizer", f"{self.optimizer!r} is not adamw, adam, sgd or muon")
        if self.tta not in ("none", "flip", "flip-last"):
            bad("tta", f"{self.tta!r} is not none, flip or flip-last")
        if not 0 <= self.mpp_warmup < 1:
            bad("mpp_warmup", f"must be in [0, 1), got {self.mpp_warmup}")
        if self.schedule not in ("cosine", "linear", "constant"):
            bad("schedule", f"{self.schedule!r} is not cosine, linear or constant")
        if self.head not in ("linear", "mlp"):
            bad("head", f"{self.head!r} is not linear or mlp")
        for opt in ("lr", "batch_size", "epochs", "accum_steps"):
            if not getattr(self, opt) > 0:
                bad(opt, f"must be positive, got {getattr(self, opt)}")
        for opt in ("batch_size", "accum_steps"):  # `vitlab plan`'s limits: far past any run, a bigger one is a typo
            if getattr(self, opt) > (most := LIMITS[f"--{opt.replace('_', '-')}"]):
                bad(opt, f"{getattr(self, opt):.3g} is more than {most:,}")
        if self.randaugment is not None and not (
            0 <= self.randaugment[0] <= RANDAUGMENT_OPS and 0 <= self.randaugment[1] < RANDAUGMENT_BINS
        ):
            bad("randaugment", f"{self.randaugment[0]},{self.randaugment[1]}: expected 0..{RANDAUGMENT_OPS} operations "
                f"and a magnitude in 0..{RANDAUGMENT_BINS - 1} (torchvision's {RANDAUGMENT_BINS} bins)")  # fmt: skip
        for opt in ("weight_decay", "warmup_epochs", "warmup_steps", "mixup", "cutmix", "min_lr_ratio", "head_warmup"):
            if getattr(self, opt) < 0:
                bad(opt, f"must be >= 0, got {getattr(self, opt)}")
        for opt in ("hflip", "random_erasing", "label_smoothing", "drop_path", "dropout", "token_drop"):
            if not 0 <= getattr(self, opt) < 1 + (opt == "hflip"):
                bad(opt, f"must be in [0, 1), got {getattr(self, opt)}")
        if not 0 < self.token_drop_until <= 1:
            bad("token_drop_until", f"must be in (0, 1], got {self.token_drop_until}")
        if self.token_drop_until < 1 and not self.token_drop:
            bad("token_drop_until", "ends token dropping, but no tokens are dropped: give --token-drop R too")
        if not 0 <= self.warmup_fraction <= 0.5:
            bad("warmup_fraction", f"must be in [0, 0.5], got {self.warmup_fraction}")
        self._validate_tuning(bad)
        if self.tuning == "head" and self.head_warmup:
            bad("head_warmup", "--freeze already trains only the head for the whole run; give one of the two")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            bad("layer_decay", f"must be in (0, 1], got {self.layer_decay}")
        if self.ema is not None and not 0 < self.ema < 1:
            bad("ema", f"decay must be in (0, 1), got {self.ema}")
        if not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            bad("crop_scale", f"expected 0 < min <= max <= 1, got {self.crop_scale}")
        if not 0 < self.crop_pct <= 1:
            bad("crop_pct", f"must be in (0, 1], got {self.crop_pct}")
        if self.base_batch is not None and not self.base_batch >= 1:  # -1 would turn the scaled LR negative
            bad("base_batch", f"must be a positive number of images (or none), got {self.base_batch}")
        if not 0 <= self.momentum < 1:
            bad("momentum", f"must be in [0, 1), got {self.momentum}")
        if not 0 <= self.min_lr_ratio <= 1:
            bad("min_lr_ratio", f"must be in [0, 1] (the final LR as a fraction of the peak), got {self.min_lr_ratio}")
        if not 0 <= self.betas[0] < 1 or not 0 <= self.betas[1] < 1:
            bad("betas", f"must be in [0, 1), got {self.betas}")

    @property
    def tuning(self) -> str:
        """THE fine-tuning method of the recipe (:data:`TUNE_METHODS`): ``tune`` when given, else ``lora`` with a
        LoRA rank, ``head`` with ``freeze`` (the linear probe), else ``full``."""
        if self.tune is not None:
            return self.tune
        return "lora" if self.lora else "head" if self.freeze else "full"

    @property
    def lora_rank(self) -> int:
        """The rank LoRA trains at: ``lora``, or :data:`LORA_RANK` when only ``tune`` asks for LoRA."""
        return self.lora or LORA_RANK

    def _validate_tuning(self, bad: Any) -> None:
        if self.tune is not None and self.tune not in TUNE_METHODS:
            bad("tune", f"{self.tune!r} is not {', '.join(TUNE_METHODS[:-1])} or {TUNE_METHODS[-1]}")
        if self.lora < 0:
            bad("lora", f"a rank must be >= 1 (0: no LoRA), got {self.lora}")
        if self.lora and self.tuning != "lora":
            bad(
                "lora", f"trains LoRA adapters, and --tune {self.tune} trains {self.tuning_what()}; give one of the two"
            )
        if self.freeze and self.tuning != "head":
            bad("freeze", f"trains the head alone, and --tune {self.tuning} trains {self.tuning_what()}; give one")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            bad("lora_alpha", f"must be positive, got {self.lora_alpha}")
        if self.lora_alpha is not None and self.tuning != "lora":
            bad("lora_alpha", "scales LoRA's updates: give --lora R too")
        if self.lora_targets is not None and self.tuning not in ("lora", "ssf"):
            bad("lora_targets", "names the layers LoRA or SSF adapt: give --lora R (or --tune ssf) too")

    def tuning_what(self) -> str:
        """What :attr:`tuning` trains, in words."""
        return {
            "full": "every weight",
            "head": "the head alone",
            "lora": "low-rank adapters and the head",
            "ssf": "scales and shifts and the head",
            "bias": "the biases and the head",
        }[self.tuning]

    def replace(self, **changes: Any) -> Recipe:
        """A copy with some fields changed (``None`` values are ignored: "not given on the CLI")."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ConfigError(f"unknown recipe option(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        return cls(**d)

    def scaled_lr(self, global_batch: int) -> float:
        return self.lr * global_batch / self.base_batch if self.base_batch else self.lr


# A tiny ViT for the 8x8 digits (103k parameters): patch 2 gives a 4x4 grid of tokens.
_DIGITS_ARCH = {
    "patch_size": 2,
    "embed_dim": 64,
    "depth": 3,
    "num_heads": 4,
    "mlp_dim": 128,
    "pool": "gap",
    "class_token": False,
}
# The SPT/LSA paper's plain-ViT baseline for CIFAR: patch 4, width 192, depth 9, 12 heads, MLP ratio 2.
_SMALL_ARCH = {"patch_size": 4, "embed_dim": 192, "depth": 9, "num_heads": 12, "mlp_dim": 384}

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            name="auto",
            source=(
                "Fitted to the data and the budget when the run starts (vitlab.train.sizing.recipe): Steiner et al. "
                "2021 (AugReg): the best augmentation and regularisation grows with the epochs and shrinks with the "
                "data, so short schedules get flip + label smoothing (a light crop from 10 epochs) and DeiT's "
                "MixUp/CutMix/RandAugment only long schedules on small data; a batch of at most 1/16 of the data; the "
                "LR lower from "
                "10 epochs; a model sized for the budget."
            ),
            expected=(
                "The default for --data DIR; 30 epochs unless --epochs or --time-budget is given. Numbers against a "
                "plain timm script: docs/training.md."
            ),
            arch=_SMALL_ARCH,
            epochs=30,
            warmup_fraction=0.1,
            crop_scale=(0.8, 1.0),
            label_smoothing=0.1,
        ),
        Recipe(
            name="digits",
            source=(
                "vitlab's default job: the small-data recipe (AdamW, warmup + cosine) scaled down to a 3-layer, "
                "width-64 ViT on scikit-learn's 8x8 digits, patch 2, mean-pooled tokens; a light random crop, no flip "
                "(digits are not mirror-symmetric), no label smoothing (it slowed convergence in a 30-epoch run)."
            ),
            expected=(
                "96.4-97.2% test top-1 on the fixed 360-image split in under a minute on 2 CPU cores "
                "(`vitlab train`, the range seen on fresh clones and machines: docs/results.md)."
            ),
            arch=_DIGITS_ARCH,
            optimizer="adamw",
            lr=3e-3,
            base_batch=64,
            batch_size=64,
            weight_decay=0.05,
            epochs=30,
            warmup_epochs=1,
            schedule="cosine",
            clip_grad=1.0,
            crop_scale=(0.85, 1.0),
            crop_ratio=(0.9, 1.1),
            hflip=0.0,
            label_smoothing=0.0,
        ),
        Recipe(
            name="small-data",
            source=(
                "Lee, Lee & Song 2021, 'Vision Transformer for Small-Size Datasets' (SPT/LSA), their plain-ViT CIFAR "
                "baseline, which follows DeiT (Touvron et al. 2021): AdamW LR 1e-3, weight decay 0.05, batch 128, 100 "
                "epochs, 10 warmup epochs + cosine, mixup 0.8 + cutmix 1.0, label smoothing 0.1, stochastic depth 0.1, "
                "random erasing 0.25; RandAugment(2, 9) stands in for their AutoAugment. Model: patch 4, width 192, "
                "depth 9, 12 heads, MLP ratio 2."
            ),
            expected=(
                "CIFAR-10 from scratch: ~93.6% after 100 epochs (reported); on 2 CPU cores see "
                "benchmarks/cifar10_small_data.sh."
            ),
            arch=_SMALL_ARCH,
            drop_path=0.1,
            optimizer="adamw",
            lr=1e-3,
            base_batch=128,
            batch_size=128,
            weight_decay=0.05,
            epochs=100,
            warmup_epochs=10,
            schedule="cosine",
            clip_grad=None,
            crop_scale=(0.8, 1.0),
            hflip=0.5,
            randaugment=(2, 9),
            random_erasing=0.25,
            mixup=0.8,
            cutmix=1.0,
            label_smoothing=0.1,
        ),
        Recipe(
            name="pretrain",
            source=(
                "Dosovitskiy et al. 2021, Sec. 4.1 and Appendix B.1 (Table 3): Adam b1=0.9 b2=0.999, batch 4096, LR "
                "1e-3 (ImageNet-21k ViT-B), weight decay 0.1, 10k linear warmup steps then linear decay, global-norm "
                "clipping at 1, dropout 0.1, the tanh pre-logits (MLP) head, Inception crop + flip at 224 px."
            ),
            expected=(
                "ViT-B/16 on ImageNet-21k for 90 epochs, then fine-tuned: 84.0% ImageNet top-1 at 384 px (Table 2). "
                "Needs accelerators."
            ),
            model="vit_b16",
            img_size=224,
            head="mlp",
            dropout=0.1,
            optimizer="adamw",
            lr=1e-3,
            base_batch=4096,
            batch_size=4096,
            weight_decay=0.1,
            epochs=90,
            warmup_steps=10_000,
            schedule="linear",
            clip_grad=1.0,
        ),
        Recipe(
            name="finetune",
            source=(
                "Dosovitskiy et al. 2021, Sec. 3.2, 4.1 and Appendix B.1.1 (Table 4), and "
                "google-research/vision_transformer configs: SGD momentum 0.9, no weight decay, batch 512, LR from "
                "{0.001, 0.003, 0.01, 0.03} (0.03 for CIFAR), 500 warmup steps then cosine decay, clipping at global "
                "norm 1, a new zero-initialised linear head, a higher resolution than pre-training with the position "
                "embeddings resampled (2-D interpolation)."
            ),
            expected="ViT-B/16 (ImageNet-21k) fine-tuned on CIFAR-10 at 384 px for 10k steps: 98.1-99.0% (Table 2/5).",
            optimizer="sgd",
            lr=0.03,
            base_batch=512,
            batch_size=512,
            weight_decay=0.0,
            momentum=0.9,
            epochs=7,
            warmup_steps=500,
            schedule="cosine",
            clip_grad=1.0,
            crop_scale=(0.08, 1.0),
        ),
        Recipe(
            name="mpp",
            source=(
                "Masked patch prediction (`vitlab train --objective mpp`), Dosovitskiy et al. 2021, Sec. 4.6 and "
                "Appendix B.1.2: Adam, base LR 2e-4 at batch 4096, 10k warmup steps + cosine decay, ViT-B/16 on JFT "
                "for 1M steps; corrupt 50% of the patch embeddings (80% [mask], 10% random patch, 10% kept), predict "
                "each one's 3-bit mean colour (512 classes). Scaled down for small data: the small-data architecture "
                "(patch 4, width 192, depth 9), batch 128, LR 1e-3 (2e-4 is for a million steps), 1 warmup epoch, "
                "weight decay 0.05, light crop + flip only: no label regularisers."
            ),
            expected=(
                "Not a classifier: fine-tune model/ with `vitlab finetune --init`; small-scale CIFAR-10 numbers in "
                "docs/analyses.md."
            ),
            arch=_SMALL_ARCH,
            optimizer="adam",
            lr=1e-3,
            base_batch=128,
            batch_size=128,
            weight_decay=0.05,
            epochs=10,
            warmup_epochs=1,
            schedule="cosine",
            clip_grad=1.0,
            crop_scale=(0.8, 1.0),
            hflip=0.5,
        ),
    )
}


def list_recipes() -> list[str]:
    return list(RECIPES)


def get_recipe(name: str, **overrides: Any) -> Recipe:
    """A named recipe with ``overrides`` applied (``None`` values ignored)."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}")
    return RECIPES[name].replace(**overrides)
