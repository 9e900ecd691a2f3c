"""``vitlab train``: train a ViT (the main job: no arguments trains on the embedded digits)."""

from __future__ import annotations

import argparse
import re
import signal
import sys

from .._units import counted
from .train_args import add_train_args

EXAMPLES = """examples:
  vitlab train                                   # the main job: embedded 8x8 digits, < 60 s on 2 CPU cores
  vitlab train --data path/to/imagefolder --epochs 10   # recipe auto: fitted to the data and the 10 epochs
  vitlab train --data path/to/imagefolder --model vit_ti16 --img-size 64 --epochs 30
  vitlab train --data path/to/cifar10 --recipe small-data --dim 192 --depth 6 --time-budget 20m
  vitlab train --out runs/cifar --resume         # continue a stopped run at the same step
  vitlab train --data path/to/cifar10 --objective mpp --out runs/mpp --time-budget 10m
                                                 # self-supervised: masked patch prediction, labels unused
  vitlab finetune --init runs/mpp/model --data path/to/cifar10 --recipe small-data --time-budget 10m
  torchrun --nproc_per_node 2 -m vitlab train --data digits --out runs/ddp
  torchrun --nproc_per_node 8 -m vitlab train --fsdp --grad-checkpointing --model vit_l16 --data DIR --out runs/l16
                                                 # FSDP2: shards weights/optimizer; resumes on any process count
"""


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "train",
        help="train a ViT from scratch (no arguments: the embedded digits, < 60 s)",
        description=(
            "Train a Vision Transformer and write metrics.jsonl, summary.json, curves.png, confusion.png,\n"
            "model/ (vitlab folder) and last.pt (exact resume) under --out. Ctrl-C, SIGTERM and SIGHUP save and stop.\n"
            "Recipes: auto (the default for --data DIR: fitted to the data's size and the budget), digits (default\n"
            "job), small-data (from scratch on small datasets), pretrain (paper), finetune (paper); every flag\n"
            "overrides its recipe.\n\n" + EXAMPLES
        ),
        formatter_class=formatter,
    )
    add_train_args(p, default_recipe=None)
    p.add_argument(
        "--objective",
        choices=["classify", "mpp"],
        default="classify",
        help="classify (labels, cross-entropy) or mpp: masked patch prediction (paper Sec. 4.6), labels unused; "
        "model/ is then a headless ViT for `vitlab finetune --init`",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace, *, init: str | None = None):
    """The :class:`~vitlab.train.TrainConfig` the arguments describe."""
    import time

    from .._units import size_option
    from ..train import TrainConfig, get_recipe
    from ._common import arch_overrides

    objective = getattr(args, "objective", "classify")
    recipe_name = args.recipe or (
        "finetune"
        if init
        else "mpp"
        if objective == "mpp"
        else "digits"
        if args.data.strip().lower() == "digits"
        else "auto"
    )
    zero_off = {"clip_grad": args.clip_grad, "ema": args.ema}
    res_schedule = _res_schedule(args)
    recipe = get_recipe(
        recipe_name,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        warmup_epochs=args.warmup_epochs,
        warmup_steps=args.warmup_steps,
        schedule=args.schedule,
        accum_steps=args.accum_steps,
        label_smoothing=args.label_smoothing,
        mixup=args.mixup,
        cutmix=args.cutmix,
        random_erasing=args.random_erasing,
        hflip=args.hflip,
        crop_scale=args.crop_scale,
        drop_path=args.drop_path,
        dropout=args.dropout,
        token_drop=args.token_drop,
        token_drop_until=args.token_drop_until,
        res_schedule=res_schedule,
        layer_decay=args.layer_decay,
        freeze=args.freeze,
        head_warmup=args.head_warmup,
    )
    for k, v in zero_off.items():
        if v is not None:
            recipe = recipe.replace(**{k: v}) if v > 0 else _with_none(recipe, k)
    if args.randaugment is not None:
        recipe = (
            _with_none(recipe, "randaugment")
            if args.randaugment == "none"
            else recipe.replace(randaugment=args.randaugment)
        )
    arch = arch_overrides(args)
    flags = set(getattr(args, "given_flags", ()))
    recipe_given = sorted(f for f in _RECIPE_FIELDS if "--" + f.replace("_", "-") in flags)
    out = args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{'finetune' if init else 'train'}"
    return TrainConfig(
        recipe=recipe,
        data=args.data,
        out=out,
        model=args.model,
        arch=arch,
        img_size=args.img_size or (res_schedule[-1][0] if res_schedule else None),
        norm_stats=getattr(args, "norm_stats", None),
        init=init,
        objective=objective,
        teacher=args.teacher,
        distill=args.distill,
        distill_token=args.distill_token,
        distill_tau=args.distill_tau,
        seed=args.seed,
        workers=args.workers,
        device=args.device,
        precision=args.precision,
        compile=args.compile,
        grad_checkpointing=getattr(args, "grad_checkpointing", False),
        fsdp=getattr(args, "fsdp", False),
        threads=args.threads,
        val_split=args.val_split,
        shuffle_buffer=args.shuffle_buffer,
        allow_pipe=getattr(args, "allow_pipe", False),
        cache_dir=args.cache_dir,
        strict_data=args.strict_data,
        max_image_pixels=args.max_image_pixels,
        allow_single_class=args.allow_single_class,
        memory_budget=size_option("--memory-budget", args.memory_budget),
        on_nan=args.on_nan,
        time_budget=args.time_budget,
        save_every=args.save_every,
        stop_after=args.stop_after,
        keep=args.keep,
        progress=not args.no_progress,
        recipe_given=recipe_given,
    )


_RECIPE_FIELDS = (
    "epochs",
    "batch_size",
    "lr",
    "optimizer",
    "weight_decay",
    "warmup_epochs",
    "warmup_steps",
    "schedule",
    "clip_grad",
    "accum_steps",
    "ema",
    "label_smoothing",
    "mixup",
    "cutmix",
    "randaugment",
    "random_erasing",
    "hflip",
    "crop_scale",
    "drop_path",
    "dropout",
    "layer_decay",
    "freeze",
    "token_drop",
    "token_drop_until",
    "res_schedule",
    "head_warmup",
)
"""Recipe fields with a flag of the same name: the ones given are kept when the recipe is fitted to the data."""


def _res_schedule(args: argparse.Namespace):
    """``--res-schedule`` parsed; the training resolution is its last size unless ``--img-size`` says it."""
    if getattr(args, "res_schedule", None) is None:
        return None
    from ..errors import ConfigError
    from ..train.resolution import parse_res_schedule

    sched = parse_res_schedule(args.res_schedule)
    if args.img_size is not None and args.img_size != sched[-1][0]:
        raise ConfigError(f"--res-schedule ends at {sched[-1][0]} px but --img-size is {args.img_size}")
    return sched


def _with_none(recipe, field: str):
    import dataclasses

    return dataclasses.replace(recipe, **{field: None})


def run(args: argparse.Namespace, *, init: str | None = None) -> int:
    from ..errors import ConfigError
    from ..train import fit

    if args.resume and not args.out:
        raise ConfigError("--resume needs --out DIR (the run to continue)")
    if args.model:
        from ..models import list_models
        from ..models.registry import resolve_name
        from ._common import close_names

        if resolve_name(args.model) not in list_models():
            hint = close_names(args.model)
            raise ConfigError(f"--model {args.model!r}: not a registered name{hint} (see `vitlab models`)")
    try:
        cfg = config_from_args(args, init=init)
    except ConfigError as e:  # "recipe 'digits': batch_size: must be positive" -> "--batch-size: must be positive"
        m = re.match(r"recipe '[^']*': (\w+): (.*)", str(e))
        raise (ConfigError(f"--{m.group(1).replace('_', '-')}: {m.group(2)}") if m else e) from None
    from ..train.loop import StoppedBeforeTraining

    given = set(getattr(args, "given_flags", ())) | ({"--init"} if init else set())
    from .._fs import removed_if_unused

    try:
        with removed_if_unused(cfg.out):  # a run that fails before writing anything leaves no empty folder
            summary = fit(cfg, resume=args.resume, given=given, overwrite=args.overwrite)
    except StoppedBeforeTraining as e:
        print(f"vitlab: {e}", file=sys.stderr)
        return 128 + e.signum
    if summary.get("objective") == "mpp" and summary.get("top1") is not None and _is_main():
        print(
            f"masked patch prediction: colour top-1 {100 * summary['top1']:.2f}% "
            f"(best {100 * summary['best_top1']:.2f}%), top-5 {100 * summary['top5']:.2f}% "
            f"after {counted(summary['epochs'], 'epoch')} / {counted(summary['steps'], 'step')}; "
            f"{summary['wall_s']:.1f} s"
        )
        print(f"results in {summary['out']}/: metrics.jsonl summary.json curves.png model/ (headless ViT) last.pt")
        print(f"fine-tune it with: vitlab finetune --init {summary['out']}/model --data DATA")
    elif summary.get("top1") is not None and summary.get("processes", 1) >= 1 and _is_main():
        classes = (summary.get("data") or {}).get("classes", 0)
        top5 = f"top-5 {100 * summary['top5']:.2f}% " if classes > 5 else ""  # <= 5 classes: 100% by construction
        print(
            f"top-1 {100 * summary['top1']:.2f}% (best {100 * summary['best_top1']:.2f}%), "
            f"{top5}after {counted(summary['epochs'], 'epoch')} / {counted(summary['steps'], 'step')}; "
            f"{summary['images_per_sec']:.0f} img/s; {summary['wall_s']:.1f} s"
        )
        print(f"results in {summary['out']}/: metrics.jsonl summary.json curves.png confusion.png model/ last.pt")
    if summary.get("interrupted") and args.stop_after is None:  # a stop signal: the shell's 128 + its number
        return 128 + (signal.Signals[summary["signal"]].value if summary.get("signal") else signal.SIGINT.value)
    return 0


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
