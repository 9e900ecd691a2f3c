"""THE option table of ``vitlab train`` and ``vitlab finetune``: one :class:`Option` row per option.

A row says where the value lives in the run's configuration (its config path: ``data``, ``recipe.lr``,
``arch.embed_dim``), how it is spelled on the command line (flag, type, choices, metavar, help, group) and in a
config file (:class:`Kind`), and how ``--resume`` treats it. Everything else is generated from the rows: the
argparse parser (:mod:`.parser`), the configuration built from the command line or a config file (:mod:`.config`),
the flag an error names (:func:`flag_for`, :class:`OptionError`), the resume rules (:mod:`.resume`) and the recipe
fields a user set. Rows without a flag are set by config files only (``recipe.momentum``); a test fails when a
field of :class:`~vitlab.train.conf.train_config.TrainConfig` or :class:`~vitlab.train.conf.recipes.Recipe` has no row
and is not in :data:`INTERNAL`.

Resume rules (:attr:`Option.resume`): ``fixed``: a resumed run refuses a change (it would be another run, or not
load); ``honoured``: applied when given (how and where the run is driven); ``process``: always this process's
value (it describes the process or the machine, never the run); ``saved``: the saved run's value, the flag unread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._text import shell_word
from ...errors import ConfigError
from .kinds import (
    DURATION,
    FLAG,
    FLOAT,
    INT,
    LOGGERS,
    MAPPING,
    NAMES,
    PAIR,
    RANDAUGMENT,
    RES_SCHEDULE,
    SIZE,
    TEXT,
    Kind,
)

__all__ = [
    "DATA_RULE",
    "INTERNAL",
    "MEMORY_BUDGET_HELP",
    "OPTIONS",
    "Option",
    "OptionError",
    "Ref",
    "flag_for",
    "option",
    "path_of",
    "ref",
]


class Ref(str):
    """A config path inside an :class:`OptionError`'s message, rendered as a flag or a config key."""


class OptionError(ConfigError):
    """A bad option, as text and references to options (:class:`Ref`, config paths). Its message names each
    option by its flag where it has one (``--lr: must be positive``); :meth:`render` names them otherwise (a
    config file's keys: ``recipe.lr: must be positive``), so that no caller takes the message apart. The first
    reference is the option at fault (:attr:`path`)."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts
        super().__init__(self.render(flag_for))
        self.option = self.path
        self.problem = self.render(flag_for, lead=False)

    @property
    def path(self) -> str:
        return next(p for p in self.parts if isinstance(p, Ref))

    def render(self, name: Callable[[str], str], *, lead: bool = True) -> str:
        """The message with each option named by ``name(path)``; without ``lead``, from after the first option."""
        parts = self.parts if lead else self.parts[self.parts.index(self.path) + 1 :]
        return "".join(name(p) if isinstance(p, Ref) else p for p in parts).lstrip(": " if not lead else "")


def ref(path: str) -> Ref:
    """The reference to option ``path`` in an :class:`OptionError` (a path without a row is a bug: KeyError)."""
    option(path)
    return Ref(path)


# -- the rows -----------------------------------------------------------------------------------------------------

BOTH = ("train", "finetune")


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option: see the module's notes."""

    path: str | None
    """Where its value lives in the configuration (``recipe.lr``); None: an instruction to the command itself
    (``--resume``), no part of the run's configuration."""
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    kind: Kind = TEXT
    default: Any = None
    """The command line's default (shown by ``--help``); None on a recipe's field: the recipe's value."""
    command_default: Mapping[str, Any] = field(default_factory=dict)
    """Another default for some commands (``finetune``'s ``--recipe finetune``)."""
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    group: str | None = None
    """The ``--help`` group (:data:`~.parser.GROUPS`); None: the command's own options."""
    help: str | None = None
    resume: str = "fixed"
    commands: tuple[str, ...] = BOTH
    required: bool = False
    zero_off: bool = False
    """0 (or less) turns the recipe's value off: None (``--clip-grad 0``)."""
    invert: bool = False
    """The flag says the opposite of the value (``--no-progress`` -> ``progress``)."""
    file: bool = True
    """Whether a config file may set it (``allow_pipe`` may not: it lets ``data`` run a shell command)."""
    nullable: bool = False
    """Whether None is a value of it (a config file's ``null``)."""
    repeat: bool = False
    """The flag may be given several times; the lists each gives are joined in order, each item once
    (``--log csv --log tensorboard,wandb``)."""

    def value(self, given: Any) -> Any:
        """The configuration's value for a value argparse parsed (or a config file's, already checked)."""
        if given is None:
            return None
        if self.kind.late is not None and isinstance(given, str):
            try:
                given = self.kind.late(given)
            except ValueError as e:
                raise OptionError(Ref(self.path), f"{self.kind.sep}{e}") from None
        if self.repeat and isinstance(given, list):
            given = list(dict.fromkeys(x for g in given for x in (g if isinstance(g, list) else [g])))
        if self.invert:
            return not given
        if (self.zero_off and given <= 0) or (self.kind is RANDAUGMENT and given == "none"):
            return None
        return given

    def from_file(self, value: Any) -> Any:
        """A config file's value, checked by the option's kind (:class:`OptionError` naming the path)."""
        if value is None and (self.nullable or (self.default is None and not self.path.startswith("recipe."))):
            return None
        try:
            value = self.kind.from_file(value)
            if self.choices is not None and value not in self.choices:
                raise ValueError(f"expected one of {', '.join(map(str, self.choices))}, got {value!r}")
            return self.value(value)
        except ValueError as e:
            raise OptionError(Ref(self.path), f": {e}") from None


DATA_RULE = (
    "digits, cifar10 and cifar100 always name the built-in data sets (a folder of that name: ./digits); an output "
    "folder is never read as data"
)
"""The rule of :data:`vitlab.data.sources.BUILTIN_DATA`, as every command's ``--data`` help states it."""

MEMORY_BUDGET_HELP = (
    "memory for building the decode cache (at most half of it holds decoded images), e.g. 512M, 2G, 64MiB or bytes "
    "(K/M/G = KiB/MiB/GiB; kB/MB/GB are SI); images are then read through a memory map"
)

O = Option  # noqa: E741  (a table reads better with short rows)
data, model, recipe, dist, run = "data", "model", "recipe", "distillation", "run"
OPTIONS: tuple[Option, ...] = (
    O(path="init", flag="--init", commands=("finetune",), required=True, resume="fixed",
      help="the model to start from: a model folder, a run folder, a checkpoint file or a public name"),
    O(path="new_head", flag="--new-head", commands=("finetune",), kind=FLAG, default=False,
      help="a new zero-initialised head even when the model's classes are the data's (the head is kept only for "
      "the same class names in the same order)"),
    O(path=None, flag="--config", metavar="FILE",
      help="a config file (YAML or JSON) of options, which the flags given override; every run writes what it was "
      "asked as config.yaml and what it chose as sizing.json: --config runs/X/config.yaml --out runs/Y asks for "
      "run X again and reads X's choices back (--replan: choose afresh)"),
    # -- data ------------------------------------------------------------------------------------------------
    O(path="data", flag="--data", group=data, default="digits",
      help="digits (embedded), cifar10, cifar100 (torchvision, online), an ImageFolder path, or tar shards: "
      "a folder `vitlab data pack` wrote or a pattern 'shards/train-{000000..000099}.tar' (streamed, not cached). "
      + DATA_RULE),
    O(path="allow_pipe", flag="--allow-pipe", group=data, kind=FLAG, default=False, resume="process", file=False,
      help="let --data hold pipe: URLs ('pipe:curl -sfL https://host/train-{000000..000099}.tar'), which run a "
      "shell command: only a --data typed on this command line with it, never a config file's data or a resumed "
      "run's (give it, and the same --data, again)"),
    O(path="shuffle_buffer", flag="--shuffle-buffer", group=data, kind=INT, default=8192, metavar="N",
      help="tar shards: samples shuffled together (the window of each epoch's order; bounds the reader's memory)"),
    O(path="val_split", flag="--val-split", group=data, kind=FLOAT,
      help="fraction held out when the folder has no val/ or test/ (stratified)"),
    O(path="cache_dir", flag="--cache-dir", group=data, resume="honoured",
      help="decoded-image cache (default ~/.cache/vitlab or $VITLAB_CACHE)"),
    O(path="strict_data", flag="--strict-data", group=data, kind=FLAG, default=False, resume="honoured",
      help="stop on files that cannot be used (not decodable, a broken link, a second path to one file) instead "
      "of skipping them, and on what the data check finds "
      "misleading: evaluation images also in training, the same picture under two classes (sure copies: identical "
      "or re-encoded, not look-alikes; docs/data_check.md)"),
    O(path="dedup_eval", flag="--dedup-eval", group=data, kind=FLAG, default=False,
      help="leave out of the evaluation split the images the data check finds also in training (byte-identical or "
      "near copies), so that top-1 is measured on unseen images"),
    O(path="max_image_pixels", flag="--max-image-pixels", group=data, kind=INT, default=89_478_485, metavar="N",
      nullable=True, help="skip (or, with --strict-data, refuse) images with more pixels: a decompression-bomb "
      "guard (PIL's limit)"),
    O(path="memory_budget", flag="--memory-budget", group=data, kind=SIZE, default="64M", metavar="SIZE",
      resume="process", nullable=True, help=MEMORY_BUDGET_HELP),
    O(path="allow_single_class", flag="--allow-single-class", group=data, kind=FLAG, default=False,
      resume="saved",
      help="train on a folder with one class folder (with a warning): its top-1 is 100%% by construction"),
    O(path="workers", flag="--workers", group=data, kind=INT, default=-1, resume="process",
      help="DataLoader worker processes (0: augment in the training process; -1: 1 on a GPU, or for tiny models "
      "whose epochs hold 50 steps or more)"),
    O(path="pack", flag="--pack", group=data, kind=FLAG, default=False,
      help="NaViT (Dehghani et al. 2023): each image at its own aspect ratio within a token budget, the batch's "
      "patch tokens packed into sequences; evaluation reports the centre crop and the native aspect ratio"),
    O(path="pack_len", flag="--pack-len", group=data, kind=INT, metavar="TOKENS",
      help="with --pack: tokens per packed sequence (default: 4 images at the highest resolution)"),
    O(path="pack_res", flag="--pack-res", group=data, kind=PAIR, metavar="LOW,HIGH",
      help="with --pack: each image gets the token budget of a square whose side is drawn in LOW..HIGH px "
      "(default: the training resolution for both)"),
    # -- model -----------------------------------------------------------------------------------------------
    O(path="model", flag="--model", group=model, help="registered name, e.g. vit_ti16 (see `vitlab models`)"),
    O(path="img_size", flag="--img-size", group=model, kind=INT,
      help="input resolution (default: the recipe's or the data's)"),
    O(path="arch.patch_size", flag="--patch-size", group=model, kind=INT,
      help="patch side P (finetune: resizes the --init model's patch projection as FlexiViT does)"),
    O(path="arch.embed_dim", flag="--dim", group=model, kind=INT, help="width D"),
    O(path="arch.depth", flag="--depth", group=model, kind=INT, help="number of blocks L"),
    O(path="arch.num_heads", flag="--heads", group=model, kind=INT,
      help="attention heads (the width D divides by it)"),
    O(path="arch.mlp_ratio", flag="--mlp-ratio", group=model, kind=FLOAT, help="MLP width / D"),
    O(path="arch.pool", flag="--pool", group=model, choices=("cls", "gap", "seq"),
      help="class token (the paper), global average pooling without one, or CCT's sequence pooling (seq: a "
      "learned softmax-weighted mean of the patch tokens, without one)"),
    O(path="arch.class_token", kind=FLAG, help="a class token (--pool cls sets it, --pool gap or seq clears it)"),
    O(path="arch.posemb", flag="--posemb", group=model, choices=("learn", "learn2d", "sincos2d", "none"),
      help="position embedding: learned 1-D (the paper), learned 2-D, fixed 2-D sine-cosine, none (Appendix D.4)"),
    # (issue 39: the remedies the attention-health alarms name)
    O(path="arch.qk_norm", flag="--qk-norm", group=model, kind=FLAG,
      help="LayerNorm on each head's queries and keys before the attention (ViT-22B, Dehghani et al. 2023): bounds the "
      "attention logits against entropy collapse"),
    O(path="arch.reg_tokens", flag="--reg-tokens", group=model, kind=INT, metavar="N",
      help="N register tokens (Darcet et al. 2024): extra learned tokens that take over the high-norm outlier "
      "tokens, e.g. 4"),
    O(path="norm_stats", flag="--norm-stats", group=model, choices=("data", "inception", "imagenet"),
      help="input normalisation of a model trained from scratch: the training set's per-channel mean/std "
      "(default), 0.5/0.5 (Google's checkpoints) or ImageNet's; an --init model keeps its own"),
    O(path="recipe.drop_path", flag="--drop-path", group=model, kind=FLOAT, help="stochastic depth rate"),
    O(path="recipe.dropout", flag="--dropout", group=model, kind=FLOAT,
      help="dropout after the position embeddings, in each block and before the head (the paper's 0.1 "
      "for ImageNet pre-training; 0: off)"),
    O(path="recipe.token_drop", flag="--token-drop", group=model, kind=FLOAT, metavar="R",
      help="training only: drop a random fraction R of each image's patch tokens after the position "
      "embeddings (PatchDropout, Liu et al. 2022; FLIP, Li et al. 2023); evaluation sees every token"),
    O(path="recipe.token_drop_until", flag="--token-drop-until", group=model, kind=FLOAT, metavar="F",
      help="with --token-drop: drop tokens for the first fraction F of the steps and train the rest on every "
      "token (FLIP's unmasked tuning), e.g. 0.9"),
    O(path="recipe.res_schedule", flag="--res-schedule", group=model, kind=RES_SCHEDULE, metavar="SIZE:FRAC,...",
      nullable=True,
      help="progressive resolution: e.g. 24:0.5,32:1.0 trains at 24 px for the first half of the steps, then "
      "32 (position embeddings resampled on the fly); evaluation and the model at the last size"),
    # -- recipe ----------------------------------------------------------------------------------------------
    O(path="recipe.name", flag="--recipe", group=recipe,
      help="preset (default: mpp for --objective mpp, digits for --data digits, else auto: fitted to the data's "
      "size and the number of steps, and with --init to fine-tuning that model; printed when the run starts)"),
    O(path="recipe.epochs", flag="--epochs", group=recipe, kind=INT, resume="honoured",
      help="passes over the training data (default: the recipe's; --time-budget plans its own)"),
    O(path="recipe.batch_size", flag="--batch-size", group=recipe, kind=INT,
      help="global batch (all processes, all accumulation steps)"),
    O(path="recipe.lr", flag="--lr", group=recipe, kind=FLOAT,
      help="peak LR at the recipe's base batch (scaled linearly with --batch-size)"),
    O(path="recipe.optimizer", flag="--optimizer", group=recipe, choices=("adamw", "adam", "sgd", "muon"),
      help="muon: torch.optim.Muon for the encoder blocks' matrices, AdamW for every other weight, one schedule"),
    O(path="recipe.weight_decay", flag="--weight-decay", group=recipe, kind=FLOAT,
      help="weight decay (decoupled for AdamW); biases, norms, position embeddings and the class token get none"),
    O(path="recipe.warmup_epochs", flag="--warmup-epochs", group=recipe, kind=FLOAT,
      help="linear LR warmup over this many epochs"),
    O(path="recipe.warmup_steps", flag="--warmup-steps", group=recipe, kind=INT,
      help="linear LR warmup over this many optimizer steps; wins over --warmup-epochs (capped at half the run)"),
    O(path="recipe.schedule", flag="--schedule", group=recipe, choices=("cosine", "linear", "constant"),
      help="the LR after warmup: cosine or linear decay to the end (the paper pre-trains with linear, fine-tunes "
      "with cosine), or constant"),
    O(path="recipe.clip_grad", flag="--clip-grad", group=recipe, kind=FLOAT, zero_off=True, nullable=True,
      help="global-norm clipping (0: off)"),
    O(path="recipe.accum_steps", flag="--accum-steps", group=recipe, kind=INT, help="gradient accumulation steps"),
    O(path="recipe.ema", flag="--ema", group=recipe, kind=FLOAT, zero_off=True, nullable=True,
      help="EMA decay of the weights, e.g. 0.999 (0: off)"),
    O(path="recipe.label_smoothing", flag="--label-smoothing", group=recipe, kind=FLOAT,
      help="label smoothing epsilon, e.g. 0.1 (0: off)"),
    O(path="recipe.mixup", flag="--mixup", group=recipe, kind=FLOAT, help="MixUp alpha (0: off)"),
    O(path="recipe.cutmix", flag="--cutmix", group=recipe, kind=FLOAT, help="CutMix alpha (0: off)"),
    O(path="recipe.randaugment", flag="--randaugment", group=recipe, kind=RANDAUGMENT, metavar="N,M",
      nullable=True, help="RandAugment ops,magnitude or none"),
    O(path="recipe.random_erasing", flag="--random-erasing", group=recipe, kind=FLOAT,
      help="probability of erasing a random rectangle of each training image (Zhong et al. 2020; 0: off)"),
    O(path="recipe.hflip", flag="--hflip", group=recipe, kind=FLOAT, help="horizontal flip probability"),
    O(path="recipe.crop_scale", flag="--crop-scale", group=recipe, kind=PAIR, metavar="MIN,MAX",
      help="random resized crop area range"),
    O(path="recipe.layer_decay", flag="--layer-decay", group=recipe, kind=FLOAT, metavar="D", nullable=True,
      help="layer-wise LR decay (BEiT, timm): block i of L at D**(L-i) x the LR, embeddings lowest, head 1 x"),
    O(path="recipe.freeze", flag="--freeze", aliases=("--linear-probe",), group=recipe, kind=FLAG,
      help="train only the classifier head (a linear probe); every other weight stays as it was"),
    O(path="recipe.head_warmup", flag="--head-warmup", group=recipe, kind=INT, metavar="STEPS",
      help="LP-FT: train only the head for the first STEPS optimizer steps, then every weight"),
    # -- parameter-efficient fine-tuning (issue 60): what trains; model/ is a plain ViT whatever it is -----------
    O(path="recipe.tune", flag="--tune", group=recipe, commands=("finetune",), nullable=True,
      choices=("full", "head", "lora", "ssf", "bias"),
      help="what fine-tuning trains, with the head always: full (every weight), head (the head alone, as --freeze), "
      "lora (low-rank adapters of the block linears, Hu et al. 2022), ssf (a scale and a shift per channel after "
      "them and after every LayerNorm, Lian et al. 2022) or bias (every bias, BitFit); the adapters are merged into "
      "the weights, so model/ is a plain ViT (default: the auto recipe picks head, lora or full by the data and "
      "model size, docs/transfer.md)"),
    O(path="recipe.lora", flag="--lora", group=recipe, commands=("finetune",), kind=INT, metavar="R",
      help="LoRA of rank R, e.g. 4 or 8 (implies --tune lora; 0: none; --tune lora alone: 8, peft's default)"),
    O(path="recipe.lora_alpha", flag="--lora-alpha", group=recipe, commands=("finetune",), kind=FLOAT,
      nullable=True, metavar="ALPHA",
      help="LoRA's updates are scaled by ALPHA/R (default: R, a scale of 1, as peft's default r=8, lora_alpha=8)"),
    O(path="recipe.lora_targets", flag="--lora-targets", group=recipe, commands=("finetune",), kind=NAMES,
      nullable=True, metavar="NAMES",
      help="the encoder blocks' linears LoRA (or SSF) adapts, named as peft's target_modules (a name or a dotted "
      "suffix of it); default qkv,proj,fc1,fc2: all four (fc1: also a SwiGLU MLP's fc1_g and fc1_x)"),
    O(path="keep_adapters", flag="--keep-adapters", group=recipe, commands=("finetune",), kind=FLAG, default=False,
      resume="honoured",
      help="with LoRA: also write the adapters alone to adapters/ (peft's adapter_model.safetensors and "
      "adapter_config.json, loadable with PeftModel.from_pretrained on the --init model)"),
    # -- the speedrun's levers (issue 38) ------------------------------------------------------------------------
    O(path="recipe.whiten_init", flag="--whiten-init", group=model, kind=FLAG, commands=("train",),
      help="before training, set the first convolution (the patch embedding, or a conv stem's first layer) to "
      "whiten the patches of up to 2048 training images (hlb-CIFAR10, airbench)"),
    O(path="recipe.mpp_warmup", flag="--mpp-warmup", group=recipe, kind=FLOAT, metavar="F", commands=("train",),
      help="masked patch prediction (paper Sec. 4.6) on the same images for the first fraction F of the steps, "
      "then classification from those weights, in the same run and budget"),
    O(path="recipe.tta", flag="--tta", group=recipe, choices=("none", "flip", "flip-last"),
      help="flip averages the logits of each image and its mirror in each epoch's evaluation and the last; "
      "flip-last in the run's last evaluation only (its score, one extra pass)"),
    # -- the recipe's fields without a flag: config files only ----------------------------------------------
    O(path="recipe.source", help="where the recipe's numbers come from"),
    O(path="recipe.expected", help="what result to expect, and at what cost"),
    O(path="recipe.model", nullable=True, help="a registered name; none: recipe.arch alone"),
    O(path="recipe.arch", kind=MAPPING, help="ViTConfig fields of the recipe's model"),
    O(path="recipe.img_size", kind=INT, nullable=True, help="the training resolution; none: the data's"),
    O(path="recipe.head", choices=("linear", "mlp"), help="the classifier head"),
    O(path="recipe.base_batch", kind=INT, nullable=True, help="the batch recipe.lr is for (scaled linearly)"),
    O(path="recipe.momentum", kind=FLOAT, help="SGD's momentum"),
    O(path="recipe.betas", kind=PAIR, help="Adam's betas"),
    O(path="recipe.warmup_fraction", kind=FLOAT, help="warmup as a fraction of the planned steps"),
    O(path="recipe.min_lr_ratio", kind=FLOAT, help="the LR at the end, as a fraction of the peak"),
    O(path="recipe.crop_ratio", kind=PAIR, help="random resized crop aspect-ratio range"),
    O(path="recipe.crop_pct", kind=FLOAT, help="evaluation: resize to img_size / crop_pct, then centre crop"),
    # -- distillation ----------------------------------------------------------------------------------------
    O(path="teacher", flag="--teacher", group=dist, metavar="MODEL_OR_RUN",
      help="distil from this trained classifier on the same classes (run or model folder, checkpoint, public "
      "name); frozen, it sees the same augmented images"),
    O(path="distill", flag="--distill", group=dist, choices=("hard", "soft"),
      help="hard: cross-entropy with the teacher's argmax (default); soft: KL at --distill-tau x tau^2; "
      "either averaged with the label cross-entropy"),
    O(path="distill_token", flag="--distill-token", group=dist, kind=FLAG, default=False,
      help="give the student DeiT's distillation token: its own head takes the teacher's target, the class head "
      "the labels (evaluation averages both)"),
    O(path="distill_tau", flag="--distill-tau", group=dist, kind=FLOAT, default=3.0, metavar="TAU",
      help="soft distillation's temperature"),
    # -- run -------------------------------------------------------------------------------------------------
    O(path="out", flag="--out", group=run, resume="process",
      help="output folder (default: runs/<timestamp>-train)"),
    O(path="seed", flag="--seed", group=run, kind=INT, default=0,
      help="seed of the initial weights, the data order and the augmentation (a held-out evaluation split "
      "stays seed 0: runs of different seeds are scored on the same images)"),
    O(path="device", flag="--device", group=run, default="auto", resume="honoured",
      help="auto, cpu, cuda, cuda:1 ..."),
    O(path="precision", flag="--precision", group=run, choices=("auto", "fp32", "bf16", "fp16"), default="auto",
      resume="honoured", help="auto: bf16 autocast on GPU, fp32 on CPU"),
    O(path="compile", flag="--compile", group=run, kind=FLAG, default=False, resume="honoured",
      help="torch.compile the model"),
    O(path="grad_checkpointing", flag="--grad-checkpointing", group=run, kind=FLAG, default=False,
      resume="honoured",
      help="activation checkpointing per block: recompute each block in the backward pass, "
      "keeping only its input (less memory, one more forward; same gradients; see vitlab plan)"),
    O(path="fsdp", flag="--fsdp", group=run, kind=FLAG, default=False,
      help="shard weights, gradients and optimizer state over the processes (FSDP2, per block; bf16 on GPU) "
      "instead of DDP; checkpoints resume on any number of processes. Under torchrun, or alone: "
      "torchrun --nproc_per_node 8 -m vitlab train --fsdp --grad-checkpointing ... (see docs/scale.md)"),
    O(path="threads", flag="--threads", group=run, kind=INT, default=0, resume="honoured",
      help="CPU threads (default 0: 1 when a step is tiny, else the cores free at start)"),
    O(path="time_budget", flag="--time-budget", group=run, kind=DURATION, metavar="DURATION",
      help="plan the schedule to end in e.g. 20m"),
    O(path="save_every", flag="--save-every", group=run, kind=FLOAT, metavar="MIN", resume="honoured",
      help="also checkpoint every MIN minutes mid-epoch"),
    O(path="stop_after", flag="--stop-after", group=run, kind=INT, metavar="STEPS", resume="process",
      help="save and stop after STEPS steps (resume later)"),
    O(path="keep", flag="--keep", group=run, choices=("best", "last"), default="last", resume="honoured",
      help="which weights model/ holds: the last epoch's, or the best top-1's (chosen on the evaluation split, so "
      "that split's top-1 of them is optimistic)"),
    O(path="on_nan", flag="--on-nan", group=run, choices=("stop", "skip"), default="stop", resume="honoured",
      help="a NaN/Inf loss: stop before the update, keeping last.pt (exit 2), "
      "or skip the step and count it in metrics.jsonl"),
    # -- seeing inside a run (issue 39): attention health and the loggers -----------------------------------
    O(path="watch_attention", flag="--watch-attention", group=run, choices=("auto", "on", "off"), default="auto",
      resume="honoured",
      help="after each evaluation, measure the attention per layer on a fixed batch of evaluation images (distance, "
      "entropy, largest logit, outlier tokens) into metrics.jsonl and health.png, with alarms in plain words; "
      "auto: while it costs at most 5%% of the run's time (measured), not with --fsdp"),
    O(path="log", flag="--log", group=run, kind=LOGGERS, default=[], repeat=True, resume="honoured",
      metavar="NAMES",
      help="also log each epoch's metrics (and the attention health, LR, throughput) to csv (scalars.csv), "
      "tensorboard, wandb (offline without an API key) or mlflow (a file store in --out), comma-separated or "
      "repeated; none by default; each but csv needs its library (pip install 'vitlab[tensorboard]' ...)"),
    O(path="strict_log", flag="--strict-log", group=run, kind=FLAG, default=False, resume="honoured",
      help="stop the run when a --log tracker cannot start or log (its server silent for $VITLAB_TRACKER_TIMEOUT "
      "s, default 15; no key); without it that tracker is off for the run, one line says so, and the run goes on"),
    O(path=None, flag="--resume", group=run, kind=FLAG, default=False,
      help="continue the run in --out from its last.pt"),
    O(path=None, flag="--replan", group=run, kind=FLAG, default=False,
      help="with --config runs/X/config.yaml: choose afresh on this machine (recipe, side, batch, threads, steps) "
      "instead of reading X's choices back from its sizing.json"),
    O(path=None, flag="--overwrite", group=run, kind=FLAG, default=False,
      help="replace the run already in --out, typed on this command line (never a config file's out:): what the run "
      "wrote there (metrics, summary, last.pt, model/ files, figures, tensorboard events) is deleted first; what "
      "vitlab did not write is kept, or stops it when the new run would replace it"),
    O(path="progress", flag="--no-progress", group=run, kind=FLAG, default=False, invert=True, resume="process",
      help="no progress bar or step lines (one line per epoch is still printed); off a terminal, plain lines "
      "replace the bar"),
    O(path="objective", flag="--objective", commands=("train",), choices=("classify", "mpp"), default="classify",
      help="classify (labels, cross-entropy) or mpp: masked patch prediction (paper Sec. 4.6), labels unused; "
      "model/ is then a headless ViT for `vitlab finetune --init`"),
)  # fmt: skip
"""Every option, in ``--help`` order."""
del O, data, model, recipe, dist, run
_BY_PATH = {o.path: o for o in OPTIONS if o.path is not None}
_BY_FLAG = {f: o for o in OPTIONS for f in (o.flag, *o.aliases) if f is not None}

INTERNAL = {"recipe", "arch", "recipe_given"}
"""Fields of the configuration that are no option: the two containers, and what the command line derives."""


def option(name: str) -> Option:
    """The row of a config path (``recipe.lr``) or a flag (``--lr``)."""
    return _BY_FLAG[name] if name.startswith("-") else _BY_PATH[name]


def path_of(name: str) -> str | None:
    """The config path of a flag (None: a flag of no option, or one that sets none, ``--resume``) or a path."""
    if not name.startswith("-"):
        return name
    row = _BY_FLAG.get(name)
    return None if row is None else row.path


def pipe_trusted(allow_pipe: bool, typed: Collection[str]) -> bool:
    """THE rule for ``pipe:`` URLs in ``data`` (each runs a shell command): trusted only when ``--allow-pipe`` and the
    ``--data`` holding them were both typed on this command line (``typed``: the flags or config paths typed there).
    A config file's ``data``, a resumed run's saved one, a default: never (a config file cannot set ``allow_pipe``
    either; a resume also needs the same ``--data`` as saved, :func:`~.resume.resumed_config`)."""
    return bool(allow_pipe) and "data" in {path_of(t) for t in typed}


def overwrite_target(overwrite: bool, typed: Collection[str], *, out: str, file: str | None) -> bool:
    """THE rule for ``--overwrite``: it acts only on a ``--out`` typed on this command line (``typed``: the flags or
    config paths typed there), never on the folder a config file names (``file``: its path; a one-line error) nor
    on a default one. Whether this run may replace the run in ``out`` (what it removes there: only what vitlab
    wrote, :mod:`vitlab.train.persist.claim`)."""
    if not overwrite:
        return False
    if "out" in {path_of(t) for t in typed}:
        return True
    if file is not None:
        raise ConfigError(
            f"--overwrite: acts only on a --out typed on this command line, never on the folder a config file "
            f"names ({file}: out: {out}); type --out {shell_word(out)} to replace the run there"
        )
    return False


def flag_for(path: str) -> str:
    """How the command line names the option at ``path``: its flag, or the path itself when it has none."""
    row = _BY_PATH.get(path)
    return row.flag if row is not None and row.flag else path
