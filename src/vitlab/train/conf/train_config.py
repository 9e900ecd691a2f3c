"""The run's configuration (:class:`TrainConfig`, with its :class:`~vitlab.train.conf.recipes.Recipe`) and how
it is built from option values keyed by config path (:func:`build_config`): the command line's
(:func:`~vitlab.train.conf.parser.namespace_values`) over a config file's (:mod:`.files`) over the defaults."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from .options import OPTIONS, option, ref
from .options import OptionError as OptionError
from .recipes import Recipe, get_recipe

__all__ = [
    "NORM_STATS",
    "TrainConfig",
    "arch_values",
    "build_config",
    "default_recipe_name",
    "muon_refusal",
    "objective_name",
    "option_paths",
    "read_saved_config",
    "run_recipe",
]


NORM_STATS = ("data", "inception", "imagenet")
"""The choices of ``--norm-stats`` (:attr:`TrainConfig.norm_stats`)."""


@dataclass
class TrainConfig:
    """One run as the user asked for it: data, model choices, recipe (the named recipe with the fields given) and
    run options. Read, never rewritten: what a run chooses on this machine and data is its
    :class:`~vitlab.train.sizing.Sizing`."""

    recipe: Recipe = field(default_factory=lambda: get_recipe("digits"))
    data: str = "digits"
    out: str = "runs/default"
    model: str | None = None
    """Registered name; overrides ``recipe.model``/``recipe.arch``."""
    arch: dict[str, Any] = field(default_factory=dict)
    """Architecture overrides: ``patch_size``, ``embed_dim``, ``depth``, ``num_heads``, ``mlp_ratio``."""
    img_size: int | None = None
    norm_stats: str | None = None
    """Input normalisation of a model trained from scratch: ``data`` (the training set's per-channel mean and
    std, :func:`vitlab.data.channel_stats`), ``inception`` (0.5 / 0.5) or ``imagenet``; None: ``data``. An
    ``--init`` model keeps the normalisation it was trained with."""
    init: str | None = None
    """Fine-tune from this model (a vitlab folder or any name/path ``vitlab.load`` accepts)."""
    keep_adapters: bool = False
    """Fine-tuning with LoRA: also write the adapters alone to ``adapters/`` in ``peft``'s files
    (:mod:`vitlab.adapters.peft_files`); ``model/`` holds the merged model either way."""
    new_head: bool = False
    """Fine-tuning: a new zero-initialised head even when the ``--init`` model's classes are the data's (same names,
    same order: otherwise it is new anyway, :func:`~vitlab.train.conf.arch.head_choice`)."""
    objective: str = "classify"
    """``classify`` (labels, cross-entropy) or ``mpp``: masked patch prediction (Sec. 4.6), labels ignored,
    a headless ViT saved in ``model/``, "top-1" is the colour-prediction accuracy
    (:mod:`vitlab.train.objectives.mpp`)."""
    teacher: str | None = None
    """Distil from this classifier (DeiT): a vitlab run or model folder, a checkpoint file or a public name
    (:mod:`vitlab.train.objectives.distill`)."""
    distill: str | None = None
    """``hard`` (the teacher's argmax; the default with a teacher) or ``soft`` (KL at ``distill_tau``)."""
    distill_token: bool = False
    """Build the student with DeiT's distillation token; its head takes the teacher's target."""
    distill_tau: float = 3.0
    """The soft distillation's temperature."""
    seed: int = 0
    workers: int = -1
    """DataLoader worker processes; -1: one worker when the model runs single-threaded on a
    machine with spare cores (augmentation then overlaps the step), else none."""
    device: str = "auto"
    precision: str = "auto"
    """``auto`` (bf16 autocast on GPU, fp32 on CPU), ``fp32``, ``bf16`` or ``fp16`` (CUDA only, with a GradScaler)."""
    compile: bool = False
    grad_checkpointing: bool = False
    """Activation checkpointing per encoder block (``model.set_grad_checkpointing``): the same gradients
    for less activation memory and one more forward pass a step."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state over the processes with FSDP2 (per encoder block
    and at the root; :mod:`vitlab.train.engine.parallel`) instead of replicating them with DDP; ``last.pt`` then
    points to a ``torch.distributed.checkpoint`` folder that resumes on any number of processes."""
    threads: int = 0
    """CPU threads for torch; 0: one thread when a training step is under ~2 GMACs (such small kernels
    lose more to thread synchronisation than they gain, badly so on a busy machine), else the cores that are free
    at start (:mod:`vitlab.train.sizing.machine`)."""
    val_split: float | None = None
    cache_dir: str | None = None
    strict_data: bool = False
    """Stop on files that cannot be decoded, and on leaks and conflicting labels the data check finds."""
    dedup_eval: bool = False
    """Leave out of the evaluation split the images the data check finds also in training (:mod:`vitlab.data.check`)."""
    max_image_pixels: int | None = None
    """Decompression-bomb guard: images with more pixels are skipped (default: PIL's 89.5 M)."""
    allow_single_class: bool = False
    """Train a classifier on data with one class (refused otherwise: every prediction is right by construction)."""
    pack: bool = False
    """NaViT's packing (Dehghani et al. 2023): images at their own aspect ratio, their patch tokens packed into
    sequences (:mod:`vitlab.train.engine.navit`)."""
    pack_len: int | None = None
    """Tokens per packed sequence; None: four images at the highest resolution."""
    pack_res: tuple[float, float] | None = None
    """``(low, high)``: each packed image's token budget is that of a square whose side is drawn in it; None: the
    model's resolution for both."""
    shuffle_buffer: int = 8192
    """Tar-shard data (:mod:`vitlab.data.shards.stream`): samples in one shuffle window, a part of each epoch's
    order."""
    allow_pipe: bool = False
    """``--allow-pipe``: ``data`` may hold ``pipe:`` URLs, which run a shell command. Trust given on this command
    line only: a resumed run never takes it from ``last.pt`` (:func:`~vitlab.train.conf.resume.resumed_config`)."""
    memory_budget: int | None = None
    """Memory budget in bytes of building the decode cache (default 64 MiB, at most half of it decoded
    images); the splits are then read from the memory map, so a dataset larger than RAM still trains."""
    on_nan: str = "stop"
    """A NaN/Inf loss: ``stop`` before the update (``last.pt`` keeps the last good state, exit 2)
    or ``skip`` the step and count it."""
    time_budget: float | None = None
    """Seconds for the whole run; the number of steps is planned from a measured step time."""
    save_every: float | None = None
    """Minutes between mid-epoch checkpoints (the end of each epoch always saves)."""
    stop_after: int | None = None
    """Save and exit after this many optimizer steps in this process (pre-emption drills, tests)."""
    keep: str = "last"
    """``model/`` holds the ``last`` weights (the default) or the ``best`` by top-1 on the evaluation split (which
    then reports them optimistically: the epoch was chosen on it)."""
    progress: bool = True
    watch_attention: str = "auto"
    """Attention health after each evaluation (:mod:`vitlab.train.engine.watch`): ``on``, ``off``, or ``auto``: while
    its measured share of the run's time stays at most 5%."""
    log: list[str] = field(default_factory=list)
    """Where each epoch's metrics also go (:mod:`vitlab.track`): ``csv``, ``tensorboard``, ``wandb``, ``mlflow``."""
    strict_log: bool = False
    """A tracker of ``log`` that cannot start or log (no answer from its server within the timeout, no key): stop
    the run in one line; False: it is off for the rest of the run (one line says so) and the run goes on."""
    recipe_given: list[str] = field(default_factory=list)
    """The recipe fields the user set (on the command line or in a config file): fitting the recipe to the data
    keeps them (:mod:`vitlab.train.sizing`, whose :class:`~vitlab.train.sizing.Sizing` holds what was fitted: this
    configuration stays what the user asked for)."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["recipe"] = self.recipe.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The configuration :meth:`to_dict` wrote. A ``last.pt`` from before the sizing room held the fitted recipe
        and its line (``resolved``) in its configuration: the line is dropped here (the caller reads that recipe as
        the run's sizing, :func:`vitlab.train.engine.run._resumed_sizing`)."""
        d = {k: v for k, v in d.items() if k != "resolved"}
        d["recipe"] = Recipe.from_dict(d["recipe"])
        return cls(**d)


def objective_name(cfg: TrainConfig) -> str:
    """What the run ``cfg`` learns, by name: ``distill`` (a classifier with ``--teacher``), ``warmstart``
    (classification after a masked-patch-prediction warm start, ``--mpp-warmup``), or ``--objective``'s ``classify``
    or ``mpp``. The objectives (:mod:`vitlab.train.objectives`) and the sizing rules (:mod:`vitlab.train.sizing`) are
    each looked up by it."""
    if cfg.teacher is not None:
        return "distill"
    if cfg.objective == "classify" and cfg.recipe.mpp_warmup:
        return "warmstart"
    return cfg.objective


def default_recipe_name(values: Mapping[str, Any]) -> str:
    """The recipe without ``--recipe`` (``values``: top-level options by path): ``auto`` with ``--init`` (fitted to
    fine-tuning that model, :mod:`.finetune`), ``mpp`` for ``--objective mpp``, ``digits`` for ``--data digits``, else
    ``auto`` (fitted to the data)."""
    if values.get("init"):
        return "auto"
    if values.get("objective") == "mpp":
        return "mpp"
    return "digits" if str(values.get("data", "digits")).strip().lower() == "digits" else "auto"


def build_config(values: Mapping[str, Any], *, given: Collection[str] = ()) -> TrainConfig:
    """The configuration ``values`` describe (config path -> value, e.g. ``{"data": "f", "recipe.lr": 0.01}``).

    Top-level paths are :class:`TrainConfig` fields (the dataclass's default where absent); ``recipe.*`` change the
    recipe ``recipe.name`` names (by default :func:`default_recipe_name`'s), ``arch.*``
    the model (``arch.pool`` sets ``arch.class_token`` too unless it is given). Without ``img_size`` a resolution
    schedule's last size is the training size. ``given``: the paths the user set; fitting the recipe to the data
    keeps the recipe's (:attr:`TrainConfig.recipe_given`)."""
    top = {p: v for p, v in values.items() if "." not in p}
    arch = arch_values(values)
    changes = {p.removeprefix("recipe."): v for p, v in values.items() if p.startswith("recipe.")}
    name = changes.pop("name", None) or default_recipe_name(top)
    given = set(given)
    if {"recipe.warmup_epochs", "recipe.warmup_steps"} & given and "warmup_fraction" not in changes:
        changes["warmup_fraction"] = 0.0  # a warmup stated in epochs or steps, 0 included, replaces the fraction
        given.add("recipe.warmup_fraction")
    recipe = dataclasses.replace(get_recipe(name), **changes) if changes else get_recipe(name)
    schedule = changes.get("res_schedule")
    if schedule and top.get("img_size") is None:
        top["img_size"] = schedule[-1][0]
    elif schedule and top["img_size"] != schedule[-1][0]:
        raise OptionError(ref("recipe.res_schedule"), f" ends at {schedule[-1][0]} px but ", ref("img_size"),
                          f" is {top['img_size']}")  # fmt: skip
    if top.get("out") is None:
        top["out"] = f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{'finetune' if top.get('init') else 'train'}"
    fields = {f.name for f in dataclasses.fields(Recipe)}
    given_fields = sorted({p.removeprefix("recipe.") for p in given if p.startswith("recipe.")} & fields - {"name"})
    return TrainConfig(recipe=recipe, arch=arch, recipe_given=given_fields, **top)


def arch_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture overrides among ``values`` (``arch.*`` paths, not None), keyed by model field; ``pool``
    asks for a class token (``cls``) or none (``gap``), as the pooling needs, unless ``class_token`` is given."""
    arch = {p.removeprefix("arch."): v for p, v in values.items() if p.startswith("arch.") and v is not None}
    if "pool" in arch and "class_token" not in arch:
        arch["class_token"] = arch["pool"] == "cls"
    return arch


def option_paths() -> list[str]:
    """Every config path a config file may hold."""
    return [o.path for o in OPTIONS if o.path is not None and o.file]


def read_saved_config(text: Any) -> TrainConfig:
    """A run's configuration as ``last.pt`` saves it (a JSON object), read as untrusted data: every value checked
    by its option's kind, as a config file's would be (``data`` a string, ``threads`` an integer, ...), before
    anything uses it. A :class:`~vitlab.errors.ConfigError` line naming the key (``config: data: expected a
    string, got list ['a']``), never a ``TypeError`` from inside the run."""
    if not isinstance(text, str):
        raise ConfigError(f"config: expected the run's configuration as JSON text, got {type(text).__name__}")
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"config: not JSON ({str(e)[:100]})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"config: expected an object of options, got {type(d).__name__}")
    if not isinstance(d.get("recipe"), dict):
        raise ConfigError(f"config: recipe: expected an object, got {type(d.get('recipe')).__name__}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    recipe_fields = {f.name for f in dataclasses.fields(Recipe)}
    paths: list[tuple[str, Any]] = []
    for key, value in d.items():
        if key == "resolved":  # a last.pt from before the sizing room: its fitted recipe's line, read as its sizing
            continue
        if key not in fields:
            raise ConfigError(f"config: {str(key)[:60]!r}: not an option of this vitlab")
        if key in ("recipe", "arch"):
            if not isinstance(value, dict):
                raise ConfigError(f"config: {key}: expected an object, got {type(value).__name__}")
            paths += [(f"{key}.{k}", v) for k, v in value.items()]
        elif key == "recipe_given":
            if not (isinstance(value, list) and all(isinstance(v, str) and v in recipe_fields for v in value)):
                raise ConfigError("config: recipe_given: expected a list of recipe fields")
        else:
            paths.append((key, value))
    missing = sorted({"recipe.name"} - {p for p, _ in paths})
    if missing:
        raise ConfigError(f"config: {missing[0]}: missing")
    for path, value in paths:
        try:
            row = option(path)
        except KeyError:
            raise ConfigError(f"config: {path[:60]}: not an option of this vitlab") from None
        if path.startswith("recipe.") and path.removeprefix("recipe.") not in recipe_fields:
            raise ConfigError(f"config: {path}: not a recipe field")
        try:
            row.from_file(value)
        except OptionError as e:
            raise ConfigError(f"config: {e.render(str)}") from None
    try:
        return TrainConfig.from_dict(d)
    except OptionError as e:  # a recipe's own check (Recipe.validate), named by its key
        raise ConfigError(f"config: {e.render(str)}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from None


def muon_refusal(cfg: TrainConfig, recipe: Recipe) -> tuple[str, str] | None:
    """``(option path, why)`` of the first setting of ``cfg`` and ``recipe`` that Muon does not go with, else None:
    the one list :func:`~vitlab.train.conf.rules.validate` refuses from and the ``auto`` recipe falls back to AdamW on
    (:func:`~vitlab.train.sizing.recipe.classify_recipe`)."""
    for refused, path, why in (
        (cfg.fsdp, "fsdp", "its sharded checkpoints hold one optimizer"),
        (recipe.layer_decay is not None, "recipe.layer_decay", "Muon's matrices take one LR"),
        (recipe.freeze, "recipe.freeze", "a linear probe trains no encoder matrix"),
        (recipe.tuning != "full", "recipe.tune", "it orthogonalises updates of whole matrices, and these train none"),
    ):
        if refused:
            return path, why
    return None


def run_recipe(cfg: TrainConfig, proposed: Recipe) -> Recipe:
    """What a run of ``cfg`` trains with when the ``auto`` recipe proposes ``proposed``: the user's fields kept,
    AdamW for a proposed Muon that a setting refuses (:func:`muon_refusal`); the fitted recipe's
    (:func:`~vitlab.train.sizing.recipe.classify_recipe`) and the probes' optimizer
    (:mod:`vitlab.train.sizing.probe`)."""
    given = {f: getattr(cfg.recipe, f) for f in cfg.recipe_given}
    new = dataclasses.replace(proposed, **given)
    if "optimizer" not in given and new.optimizer == "muon" and muon_refusal(cfg, new):
        new = dataclasses.replace(new, optimizer="adamw")
    return new
