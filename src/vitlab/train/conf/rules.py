"""Every check of a run's options, made before any data is decoded or any model built (or, for what needs them,
as soon as they are known: the ``--init`` checkpoint's config, the model's size): a wrong option fails in a second,
in one line that names it (:class:`~vitlab.train.conf.options.OptionError`). A recipe's own fields are checked when
it is made (:meth:`~vitlab.train.conf.recipes.Recipe.validate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...models.config import ViTConfig
from ...models.variants import close_names, list_models, model_config, resolve_name
from . import arch
from .navit import MAX_SIDE, check_pack
from .options import OptionError, option, ref
from .train_config import NORM_STATS, TrainConfig, muon_refusal

if TYPE_CHECKING:
    pass

__all__ = [
    "LOCATIONS",
    "check_distillation",
    "check_fsdp",
    "check_init",
    "check_levers",
    "check_location",
    "check_locations",
    "check_tuning",
    "micro_batch",
    "validate",
]


def validate(cfg: TrainConfig) -> None:
    """Refuse impossible options (see the module's notes): first what the options alone decide (this module), then
    what the model names, the packing, the architecture and the optimizer decide."""
    for path, most, what in (("model", MAX_NAME, "a registered name"), ("device", 64, "a device name")):
        value = getattr(cfg, path)
        if isinstance(value, str) and len(value) > most:  # refused without echoing a value that fills the terminal
            raise OptionError(ref(path), f": {len(value):,} characters, longer than {what}")
    if cfg.objective not in option("objective").choices:  # type: ignore[operator]
        raise OptionError(ref("objective"), f" {cfg.objective!r}: choose one of classify, mpp")
    _check_run(cfg)
    check_distillation(cfg)
    if cfg.fsdp:
        check_fsdp(cfg)
    if cfg.norm_stats not in (None, *NORM_STATS):
        raise OptionError(ref("norm_stats"), f" {cfg.norm_stats}: expected one of {', '.join(NORM_STATS)}")
    if cfg.init and cfg.norm_stats:
        raise OptionError(
            ref("norm_stats"),
            f" {cfg.norm_stats}: an ",
            ref("init"),
            " model keeps the normalisation it was trained with (its weights expect it); drop the flag",
        )
    check_levers(cfg)
    check_tuning(cfg)
    if cfg.model and resolve_name(cfg.model) not in list_models():
        hint = f"; did you mean {', '.join(close)}?" if (close := close_names(cfg.model)) else ""
        raise OptionError(ref("model"), f" {cfg.model!r}: not a registered name{hint} (see `vitlab models`)")
    check_pack(cfg)
    if not cfg.init:  # an --init model's architecture is in its file: check_init, once it is read
        arch.check(cfg)
        arch.check_stem(cfg)
    if cfg.recipe.optimizer == "muon" and (refused := muon_refusal(cfg, cfg.recipe)):
        raise OptionError(ref("recipe.optimizer"), " muon with ", ref(refused[0]), f": not supported ({refused[1]})")


MAX_PATH = 4096
"""The longest local path a location option may hold (Linux's ``PATH_MAX``); a name in it at most :data:`MAX_NAME`
bytes (``NAME_MAX``). Longer cannot exist: the file system refuses it (``File name too long``)."""
MAX_NAME = 255
MAX_URL = 1 << 16
"""The longest URL or ``pipe:`` command (a signed URL's query can be long; 64 KiB is far beyond any)."""
LOCATIONS = ("data", "out", "init", "teacher", "cache_dir")
"""The options that name a file, folder or URL."""


def check_location(path: str, value: str) -> None:
    """Refuse a location that cannot exist (one line naming the option, never the value itself, which may be a
    million characters): a NUL character, more than :data:`MAX_PATH` characters (a URL or ``pipe:``: more than
    :data:`MAX_URL`), or a name longer than :data:`MAX_NAME` bytes in a local path."""
    if not value.strip():
        raise OptionError(ref(path), ": empty; give a folder, file or URL")
    if "\0" in value:
        raise OptionError(ref(path), ": contains a NUL character, which no path or URL holds")
    url = "://" in value or value.startswith(("pipe:", "file:"))
    limit = MAX_URL if url else MAX_PATH
    if len(value) > limit:
        raise OptionError(ref(path), f": {len(value):,} characters, longer than any {'URL' if url else 'path'} "
                          f"({limit:,})")  # fmt: skip
    longest = 0 if url else max(len(part.encode("utf-8", "replace")) for part in value.split("/"))
    if longest > MAX_NAME:
        raise OptionError(ref(path), f": holds a name of {longest:,} bytes, longer than a file system allows "
                          f"({MAX_NAME})")  # fmt: skip


def check_locations(cfg: TrainConfig) -> None:
    """:func:`check_location` for each option of ``cfg`` that names a file, folder or URL (:data:`LOCATIONS`):
    before anything looks at one."""
    for path in LOCATIONS:
        if isinstance(value := getattr(cfg, path), str):
            check_location(path, value)


def _check_run(cfg: TrainConfig) -> None:
    check_locations(cfg)
    if cfg.on_nan not in ("stop", "skip"):
        raise OptionError(ref("on_nan"), f" {cfg.on_nan!r}: choose stop or skip")
    for path, v, ok in (
        ("save_every", cfg.save_every, lambda x: x > 0),
        ("stop_after", cfg.stop_after, lambda x: x >= 1),
        ("time_budget", cfg.time_budget, lambda x: x > 0),
        ("max_image_pixels", cfg.max_image_pixels, lambda x: x >= 1),
        ("memory_budget", cfg.memory_budget, lambda x: x >= 1),
        ("img_size", cfg.img_size, lambda x: 1 <= x <= MAX_SIDE),
        ("val_split", cfg.val_split, lambda x: 0 < x < 1),
        ("shuffle_buffer", cfg.shuffle_buffer, lambda x: x >= 1),
    ):
        if v is not None and not ok(v):
            raise OptionError(ref(path), f" {v}: out of range")
    if not 0 <= cfg.seed < 1 << 63:  # what torch's and NumPy's generators take
        raise OptionError(ref("seed"), f" {cfg.seed:.3g}: out of range [0, 2**63)")
    if cfg.workers < -1 or cfg.threads < 0:
        raise OptionError(ref("workers"), f" {cfg.workers} / ", ref("threads"), f" {cfg.threads}: must be >= -1 / >= 0")


def check_levers(cfg: TrainConfig) -> None:
    """The speedrun's training levers (issue 38) that the options alone refuse: flip TTA for a classifier; the
    whitening initialisation and the masked-patch-prediction warm start for a fresh model, the warm start for
    classification without a teacher. Muon's refusals (:func:`~vitlab.train.conf.train_config.muon_refusal`) and
    the stem the two initialisations need (:func:`~vitlab.train.conf.arch.check_stem`) are checked by
    :func:`validate` after."""
    r = cfg.recipe
    if r.tta != "none" and cfg.objective != "classify":
        raise OptionError(ref("recipe.tta"), f" {r.tta} averages class logits; ", ref("objective"),
                          f" {cfg.objective} has no classes")  # fmt: skip
    if not (r.whiten_init or r.mpp_warmup):
        return
    lever = "recipe.whiten_init" if r.whiten_init else "recipe.mpp_warmup"
    if cfg.init:
        raise OptionError(ref(lever), " starts a fresh model; an ", ref("init"), " model has trained weights")
    if r.mpp_warmup and (cfg.objective != "classify" or cfg.teacher is not None):
        other = ("teacher", cfg.teacher) if cfg.teacher is not None else ("objective", cfg.objective)
        raise OptionError(ref("recipe.mpp_warmup"), " warms up a classifier: not with ", ref(other[0]), f" {other[1]}")


def check_tuning(cfg: TrainConfig) -> None:
    """Parameter-efficient fine-tuning (``--tune``, ``--lora``; the recipe checks its own fields): it adapts a
    pre-trained model (``--init``), in one process or under DDP (not ``--fsdp``: untested with wrapped layers); and
    ``--keep-adapters`` keeps LoRA's adapters, which the other methods do not make."""
    t = cfg.recipe.tuning
    path, shown = (
        ("recipe.lora", cfg.recipe.lora) if cfg.recipe.lora and cfg.recipe.tune is None else ("recipe.tune", t)
    )
    if t in ("lora", "ssf", "bias") and not cfg.init:
        raise OptionError(ref(path), f" {shown} adapts a pre-trained model: give it with vitlab finetune --init MODEL")
    if t in ("lora", "ssf") and cfg.fsdp:
        raise OptionError(ref("fsdp"), " with ", ref(path), f" {shown}: not supported (the adapters are small: drop "
                          "--fsdp, DDP holds them whole)")  # fmt: skip
    if cfg.keep_adapters and t != "lora":
        raise OptionError(ref("keep_adapters"), " writes LoRA's adapters: give ", ref("recipe.lora"), " R too")


def check_distillation(cfg: TrainConfig) -> None:
    """The distillation options (DeiT): a teacher for a classifier, a known kind, a positive temperature."""
    if cfg.teacher is None:
        if cfg.distill is not None or cfg.distill_token:
            raise OptionError(ref("distill"), " / ", ref("distill_token"), " need a teacher: ", ref("teacher"),
                              " MODEL_OR_RUN")  # fmt: skip
        return
    if cfg.objective != "classify":
        raise OptionError(
            ref("teacher"), " distils a classifier; ", ref("objective"), f" {cfg.objective} has no classes"
        )
    if cfg.distill is not None and cfg.distill not in option("distill").choices:  # type: ignore[operator]
        raise OptionError(ref("distill"), f" {cfg.distill!r}: choose hard or soft")
    if not cfg.distill_tau > 0:
        raise OptionError(ref("distill_tau"), f" {cfg.distill_tau:g}: must be positive")


def check_fsdp(cfg: TrainConfig) -> None:
    """What ``--fsdp`` does not combine with."""
    r = cfg.recipe
    for refused, why, path, shown in (
        (bool(r.ema), "the averaged copy would be a second, unsharded model", "recipe.ema", ""),
        (cfg.time_budget is not None, "its plan times steps on an unsharded copy of the model; give --epochs",
         "time_budget", ""),
        (r.head_warmup > 0, "it switches weights' requires_grad after sharding; use --freeze, then fine-tune",
         "recipe.head_warmup", ""),
        (cfg.precision == "fp16", "float16 needs a sharded gradient scaler; use bf16 (the default on GPU)",
         "precision", " fp16"),
    ):  # fmt: skip
        if refused:
            raise OptionError(ref("fsdp"), " with ", ref(path), f"{shown}: not supported ({why})")


_INIT_FIELDS = ("patch_size", "embed_dim", "depth", "num_heads")
_INIT_ONLY = ("qk_norm", "reg_tokens")
"""Fields an ``--init`` checkpoint fixes, compared when their flag is given (a ``--model`` name does not set them)."""


def check_init(cfg: TrainConfig, have: ViTConfig) -> None:
    """``--init`` takes the architecture from its checkpoint (``have``, its configuration): options that contradict
    it are refused, except ``--patch-size``, which resizes the patch projection as FlexiViT does (Beyer et al. 2023);
    and a distillation token must be in the checkpoint to be trained."""
    wanted = {k: v for k, v in cfg.arch.items() if k in (*_INIT_FIELDS[1:], *_INIT_ONLY) and v is not None}
    if cfg.model:
        m = model_config(cfg.model)
        named = {k: getattr(m, k) for k in _INIT_FIELDS if k != "patch_size" or not cfg.arch.get("patch_size")}
        wanted = {**named, **wanted}
    for k, v in wanted.items():
        if getattr(have, k) != v:
            what = ("model", f" {cfg.model}") if cfg.model and k not in cfg.arch else (f"arch.{k}", f" {v}")
            raise OptionError(
                ref(what[0]),
                f"{what[1]} does not match the ",
                ref("init"),
                f" checkpoint {cfg.init} ({k} = {getattr(have, k)}); drop the flag or pick another checkpoint",
            )
    if cfg.distill_token and not have.dist_token:
        raise OptionError(
            ref("distill_token"),
            ": the ",
            ref("init"),
            f" model {cfg.init} has no distillation token; drop the flag (the class head then takes the teacher's "
            "target)",
        )


def micro_batch(batch_size: int, *, world_size: int, accum_steps: int) -> int:
    """Images per forward pass on each process; the global batch must split evenly over both."""
    micro = batch_size // (world_size * accum_steps)
    if micro < 1 or micro * world_size * accum_steps != batch_size:
        raise OptionError(ref("recipe.batch_size"), f" {batch_size} must be a multiple of processes x ",
                          ref("recipe.accum_steps"), f" = {world_size * accum_steps}")  # fmt: skip
    return micro
