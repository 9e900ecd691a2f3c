"""The run's configuration (:class:`TrainConfig`) and its checks, made before any data is decoded
or any model built, so that a wrong option fails in a second with the option's name."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .recipes import Recipe, get_recipe

__all__ = ["TrainConfig", "resumed_config", "validate_config"]


NORM_STATS = ("data", "inception", "imagenet")
"""The choices of ``--norm-stats`` (:attr:`TrainConfig.norm_stats`)."""


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
    norm_stats: str | None = None
    """Input normalisation of a model trained from scratch: ``data`` (the training set's per-channel mean and
    std, :func:`vitlab.data.channel_stats`), ``inception`` (0.5 / 0.5) or ``imagenet``; None: ``data``. An
    ``--init`` model keeps the normalisation it was trained with."""
    init: str | None = None
    """Fine-tune from this model (a vitlab folder or any name/path ``vitlab.load`` accepts)."""
    objective: str = "classify"
    """``classify`` (labels, cross-entropy) or ``mpp``: masked patch prediction (Sec. 4.6), labels ignored,
    a headless ViT saved in ``model/``, "top-1" is the colour-prediction accuracy (:mod:`vitlab.train.mpp`)."""
    teacher: str | None = None
    """Distil from this classifier (DeiT): a vitlab run or model folder, a checkpoint file or a public name
    (:mod:`vitlab.train.distill`)."""
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
    and at the root; :mod:`vitlab.train.fsdp`) instead of replicating them with DDP; ``last.pt`` then
    points to a ``torch.distributed.checkpoint`` folder that resumes on any number of processes."""
    threads: int = 0
    """CPU threads for torch; 0: one thread when a training step is under ~2 GMACs (such small kernels
    lose more to thread synchronisation than they gain, badly so on a busy machine), else torch's default."""
    val_split: float | None = None
    cache_dir: str | None = None
    strict_data: bool = False
    max_image_pixels: int | None = None
    """Decompression-bomb guard: images with more pixels are skipped (default: PIL's 89.5 M)."""
    allow_single_class: bool = False
    """Train a classifier on data with one class (refused otherwise: every prediction is right by construction)."""
    shuffle_buffer: int = 8192
    """Tar-shard data (:mod:`vitlab.data.stream`): samples in one shuffle window, a part of each epoch's order."""
    allow_pipe: bool = False
    """``--allow-pipe``: ``data`` may hold ``pipe:`` URLs, which run a shell command. Trust given on this command
    line only: a resumed run never takes it from ``last.pt`` (:func:`resumed_config`)."""
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
    keep: str = "best"
    """``model/`` holds the ``best`` (by top-1) or the ``last`` weights."""
    progress: bool = True
    recipe_given: list[str] = field(default_factory=list)
    """The recipe fields the user set (on the command line): fitting the recipe to the data keeps them."""
    resolved: str | None = None
    """How the recipe was fitted to the data (:func:`~vitlab.train.auto.fit_recipe_to_data`), the line
    the run printed; ``None``: not fitted (yet). A resumed run keeps its fitted recipe unchanged."""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["recipe"] = self.recipe.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        d["recipe"] = Recipe.from_dict(d["recipe"])
        return cls(**d)


def resumed_config(
    state: dict[str, Any],
    given: TrainConfig,
    *,
    flags: Collection[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainConfig:
    """The configuration saved in the checkpoint ``state`` with what ``given`` may change: a resumed
    run is the same run, only how it is driven may change.

    ``flags`` are the options given on this command line (``--dim``, ``--epochs`` ...). Each is compared
    with the saved run. A change the run cannot honour (architecture, data, batch, optimisation, seed:
    see ``_FIXED``) is a :class:`~vitlab.errors.ConfigError` that lists every difference as
    ``--flag saved -> given``. A change it can honour (``_HONOURED``) is applied and reported in one line
    through ``log``; ``--epochs`` also re-plans ``state["plan"]`` to the new number of epochs. Options
    not given keep the saved run's values. ``None`` (a library call, which cannot say what was given):
    only ``--save-every`` and a relaxed ``--on-nan`` are taken from ``given``.

    ``--out``, ``--stop-after``, ``--no-progress``, ``--workers`` and ``--memory-budget`` describe this
    process and the machine it runs on, not the run: they are always taken from ``given``.

    The saved data location is data read from a file, never trust: it is checked again as if typed
    (:func:`~vitlab.data.shard_source.open_source`), and ``--allow-pipe`` (``pipe:`` URLs run a shell command)
    holds only when given on this command line together with the same ``--data``, spelled exactly as saved."""
    saved = TrainConfig.from_dict(json.loads(state["config"]))
    if flags is None:
        flags = {"--save-every"} | ({"--on-nan"} if given.on_nan != "stop" else set())
    cfg = dataclasses.replace(
        saved,
        workers=given.workers,
        stop_after=given.stop_after,
        progress=given.progress,
        out=given.out,
        memory_budget=given.memory_budget,
        allow_pipe=given.allow_pipe and "--data" in flags and str(saved.data).strip() == str(given.data).strip(),
    )
    plan = state.get("plan", {})
    refused, applied = [], []
    for flag in sorted(set(flags) & (set(_FIXED) | set(_HONOURED)), key=_FLAG_ORDER.index):
        was, now = _value(saved, flag), _value(given, flag)
        if flag == "--epochs":
            was = plan.get("epochs", was)  # a --time-budget run planned its own number of epochs
        if _same(flag, was, now):
            continue
        change = f"{flag} {_show(was)} -> {_show(now)}"
        if flag in _FIXED:
            refused.append(change)
            continue
        if flag == "--epochs":
            done = int(state.get("epoch", 0))
            cfg.recipe = dataclasses.replace(cfg.recipe, epochs=now)
            plan.update(epochs=now, total_steps=now * plan["steps_per_epoch"])
            change += (
                f" ({done} epoch(s) already done: the run finishes now)"
                if now <= done
                else f" (the run continues to step {plan['total_steps']}; the learning-rate schedule now ends there)"
            )
        else:
            setattr(cfg, _HONOURED[flag], now)
        applied.append(change)
    if refused:
        raise ConfigError(
            f"--resume: {given.out} was started with other settings, which a resumed run cannot change: "
            f"{', '.join(refused)}; drop the flag(s), or start a new run (--out elsewhere or --overwrite)"
        )
    if applied and log is not None:
        log(f"--resume: applied {', '.join(applied)}")
    return cfg


_FIXED = {
    # what the run computes: changing it would make a different run, or fail to load the saved state
    "--data": "data",
    "--val-split": "val_split",
    "--max-image-pixels": "max_image_pixels",
    "--shuffle-buffer": "shuffle_buffer",
    "--objective": "objective",
    "--init": "init",
    "--model": "model",
    "--img-size": "img_size",
    "--norm-stats": "norm_stats",
    "--patch-size": "arch.patch_size",
    "--dim": "arch.embed_dim",
    "--depth": "arch.depth",
    "--heads": "arch.num_heads",
    "--mlp-ratio": "arch.mlp_ratio",
    "--pool": "arch.pool",
    "--posemb": "arch.posemb",
    "--teacher": "teacher",
    "--distill": "distill",
    "--distill-token": "distill_token",
    "--distill-tau": "distill_tau",
    "--seed": "seed",
    "--recipe": "recipe.name",
    "--batch-size": "recipe.batch_size",
    "--accum-steps": "recipe.accum_steps",
    "--lr": "recipe.lr",
    "--optimizer": "recipe.optimizer",
    "--weight-decay": "recipe.weight_decay",
    "--warmup-epochs": "recipe.warmup_epochs",
    "--warmup-steps": "recipe.warmup_steps",
    "--schedule": "recipe.schedule",
    "--clip-grad": "recipe.clip_grad",
    "--ema": "recipe.ema",
    "--label-smoothing": "recipe.label_smoothing",
    "--mixup": "recipe.mixup",
    "--cutmix": "recipe.cutmix",
    "--randaugment": "recipe.randaugment",
    "--random-erasing": "recipe.random_erasing",
    "--hflip": "recipe.hflip",
    "--crop-scale": "recipe.crop_scale",
    "--drop-path": "recipe.drop_path",
    "--dropout": "recipe.dropout",
    "--layer-decay": "recipe.layer_decay",
    "--freeze": "recipe.freeze",
    "--token-drop": "recipe.token_drop",
    "--token-drop-until": "recipe.token_drop_until",
    "--res-schedule": "recipe.res_schedule",
    "--head-warmup": "recipe.head_warmup",
    "--time-budget": "time_budget",  # the saved plan was measured from it; --epochs changes the length
    "--fsdp": "fsdp",  # the checkpoint's format (sharded folder or last.pt) follows it
}
"""Options a resumed run refuses to change -> where they live in :class:`TrainConfig`."""
_HONOURED = {
    # how and where the run is driven: applied when given
    "--epochs": "recipe.epochs",
    "--save-every": "save_every",
    "--keep": "keep",
    "--on-nan": "on_nan",
    "--strict-data": "strict_data",
    "--cache-dir": "cache_dir",
    "--device": "device",
    "--precision": "precision",
    "--threads": "threads",
    "--compile": "compile",
    "--grad-checkpointing": "grad_checkpointing",
}
"""Options a resumed run applies when they are given -> their :class:`TrainConfig` field."""
_FLAG_ORDER = [*_FIXED, *_HONOURED]


def _value(cfg: TrainConfig, flag: str) -> Any:
    """The value ``flag`` has in ``cfg``; architecture flags as the model builder resolves them, so that
    a flag equal to the recipe's value is no change."""
    where = {**_FIXED, **_HONOURED}[flag]
    if where.startswith("recipe."):
        return getattr(cfg.recipe, where.removeprefix("recipe."))
    if where.startswith("arch."):
        return _architecture(cfg).get(where.removeprefix("arch."))
    if flag == "--model":
        return cfg.model or cfg.recipe.model
    if flag == "--norm-stats":  # not given: the training set's, as ``data`` names them
        return cfg.norm_stats or (None if cfg.init else "data")
    return getattr(cfg, where)


def _architecture(cfg: TrainConfig) -> dict[str, Any]:
    """The architecture fields the flags set, resolved as :func:`~vitlab.train.build.build_model` does
    (``--init`` runs: the flags' own values, which :func:`validate_config` checks against the checkpoint)."""
    from ..models import ViTConfig, model_config

    arch = {k: v for k, v in cfg.arch.items() if v is not None}
    name = cfg.model or cfg.recipe.model
    try:
        base = model_config(name) if name else ViTConfig(name="vit_custom", **cfg.recipe.arch)
    except (ConfigError, KeyError, TypeError, ValueError):  # an unknown --model: compared by its name
        return arch
    ratio = arch.get("mlp_ratio") or base.mlp_dim / base.embed_dim
    fields = ("patch_size", "embed_dim", "depth", "num_heads", "pool", "posemb")
    return {**{f: arch.get(f, getattr(base, f)) for f in fields}, "mlp_ratio": ratio}


def _same(flag: str, was: Any, now: Any) -> bool:
    if flag in ("--data", "--init", "--teacher", "--cache-dir") and isinstance(was, str) and isinstance(now, str):
        a, b = Path(was).expanduser(), Path(now).expanduser()
        if a.exists() and b.exists():
            return a.resolve() == b.resolve()
        return was.strip().lower() == now.strip().lower()
    if isinstance(was, float) or isinstance(now, float):
        return was is not None and now is not None and abs(was - now) <= 1e-12 * max(abs(was), abs(now))
    return was == now


def _show(v: Any) -> str:
    """A value as the command line spells it."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (tuple, list)):
        return ",".join(_show(x) for x in v)
    return str(v)


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
        ("--shuffle-buffer", cfg.shuffle_buffer, lambda x: x >= 1),
    ):
        if v is not None and not ok(v):
            raise ConfigError(f"{flag} {v}: out of range")
    if cfg.workers < -1 or cfg.threads < 0:
        raise ConfigError(f"--workers {cfg.workers} / --threads {cfg.threads}: must be >= -1 / >= 0")
    from .distill import check_distill_config

    check_distill_config(cfg)
    if cfg.fsdp:
        from .fsdp import check_fsdp_config

        check_fsdp_config(cfg)
    if cfg.norm_stats not in (None, *NORM_STATS):
        raise ConfigError(f"--norm-stats {cfg.norm_stats}: expected one of {', '.join(NORM_STATS)}")
    r = cfg.recipe
    if cfg.init:
        if cfg.norm_stats:
            raise ConfigError(
                f"--norm-stats {cfg.norm_stats}: an --init model keeps the normalisation it was trained with "
                "(its weights expect it); drop the flag"
            )
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
    """``--init`` takes the architecture from the checkpoint: flags that contradict it are an error, except
    ``--patch-size``, which resizes the patch projection as FlexiViT does (Beyer et al. 2023)."""
    from ..models import model_config

    wanted = {k: v for k, v in cfg.arch.items() if k in _FLAGS and k != "patch_size" and v is not None}
    if cfg.model:
        m = model_config(cfg.model)
        wanted = {
            **({} if cfg.arch.get("patch_size") else {"patch_size": m.patch_size}),
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
                f"{flag} does not match the --init checkpoint {cfg.init} ({k} = {getattr(have, k)}); "
                "drop the flag or pick another checkpoint"
            )
