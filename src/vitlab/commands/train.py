"""``vitlab train``: train a ViT (the main job: no arguments trains on the embedded digits)."""

from __future__ import annotations

import argparse
import re
import signal
import sys

RECIPE_NAMES = [
    "auto",
    "digits",
    "small-data",
    "pretrain",
    "finetune",
    "mpp",
]  # mirrors vitlab.train.recipes (kept import-free)

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
"""


MEMORY_BUDGET_HELP = (
    "memory for building the decode cache (at most half of it holds decoded images), e.g. 512M, 2G, 64MiB or bytes "
    "(K/M/G = KiB/MiB/GiB; kB/MB/GB are SI); images are then read through a memory map"
)


def parse_duration(text: str) -> float:
    """``20m`` / ``90s`` / ``1.5h`` / ``7d`` / ``1200`` (seconds) -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhd]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 20m, 90s, 1h or 7d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _pair(text: str) -> tuple[float, float]:
    parts = [float(v) for v in str(text).replace(",", " ").split()]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected two numbers like 0.08,1")
    return parts[0], parts[1]


def _randaugment(text: str) -> tuple[int, int] | str:
    if str(text).lower() in ("none", "off", "0"):
        return "none"
    parts = str(text).replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NUM_OPS,MAGNITUDE like 2,9 (or 'none')")
    return int(parts[0]), int(parts[1])


class _NoteGiven(argparse.Action):
    """Mixed into the parser's actions by :func:`_note_given_flags`: remembers the option's flag."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        namespace.given_flags = frozenset(getattr(namespace, "given_flags", ())) | {self.option_strings[0]}
        super().__call__(parser, namespace, values, option_string)


def _note_given_flags(p: argparse.ArgumentParser) -> None:
    """Make the options added to ``p`` from now on record their flag in ``args.given_flags`` when they
    appear on the command line: ``--resume`` compares what the user said, not the defaults, with the
    saved run. argparse calls an action only for an option that is given; defaults are set without it."""
    for name in (None, "store", "store_true"):
        base = p._registry_get("action", name, None)
        p.register("action", name, type(f"Noted{base.__name__}", (_NoteGiven, base), {}))


def add_train_args(p: argparse.ArgumentParser, *, default_recipe: str | None) -> None:
    """Arguments shared by ``train`` and ``finetune``; ``None`` defaults mean "the recipe's value"."""
    _note_given_flags(p)
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default="digits",
        help="digits (embedded), cifar10, cifar100 (torchvision, online) or an ImageFolder path",
    )
    g.add_argument(
        "--val-split",
        type=float,
        default=None,
        help="fraction held out when the folder has no val/ or test/ (stratified)",
    )
    g.add_argument("--cache-dir", default=None, help="decoded-image cache (default ~/.cache/vitlab or $VITLAB_CACHE)")
    g.add_argument(
        "--strict-data", action="store_true", help="stop on files that cannot be decoded instead of skipping them"
    )
    g.add_argument(
        "--max-image-pixels",
        type=int,
        default=89_478_485,
        metavar="N",
        help="skip (or, with --strict-data, refuse) images with more pixels: a decompression-bomb guard (PIL's limit)",
    )
    g.add_argument("--memory-budget", default="64M", metavar="SIZE", help=MEMORY_BUDGET_HELP)
    g.add_argument(
        "--allow-single-class",
        action="store_true",
        help="train on a folder with one class folder (with a warning): its top-1 is 100%% by construction",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=-1,
        help="DataLoader worker processes (0: augment in the training process; -1: 1 for tiny models or on GPU)",
    )

    g = p.add_argument_group("model (defaults: the recipe's)")
    g.add_argument("--model", default=None, help="registered name, e.g. vit_ti16 (see `vitlab models`)")
    g.add_argument("--img-size", type=int, default=None, help="input resolution (default: the recipe's or the data's)")
    g.add_argument(
        "--patch-size",
        type=int,
        default=None,
        help="patch side P (finetune: resizes the --init model's patch projection as FlexiViT does)",
    )
    g.add_argument("--dim", type=int, default=None, help="width D")
    g.add_argument("--depth", type=int, default=None, help="number of blocks L")
    g.add_argument("--heads", type=int, default=None)
    g.add_argument("--mlp-ratio", type=float, default=None, help="MLP width / D")
    g.add_argument(
        "--pool",
        choices=["cls", "gap"],
        default=None,
        help="class token (the paper) or global average pooling without one",
    )
    g.add_argument(
        "--posemb",
        choices=["learn", "learn2d", "sincos2d", "none"],
        default=None,
        help="position embedding: learned 1-D (the paper), learned 2-D, fixed 2-D sine-cosine, none (Appendix D.4)",
    )
    g.add_argument("--drop-path", type=float, default=None, help="stochastic depth rate")
    g.add_argument("--dropout", type=float, default=None)
    g.add_argument(
        "--token-drop",
        type=float,
        default=None,
        metavar="R",
        help="training only: drop a random fraction R of each image's patch tokens after the position "
        "embeddings (PatchDropout, Liu et al. 2022; FLIP, Li et al. 2023); evaluation sees every token",
    )
    g.add_argument(
        "--res-schedule",
        default=None,
        metavar="SIZE:FRAC,...",
        help="progressive resolution: e.g. 24:0.5,32:1.0 trains at 24 px for the first half of the steps, then "
        "32 (position embeddings resampled on the fly); evaluation and the model at the last size",
    )

    g = p.add_argument_group("recipe (each flag overrides the recipe's value)")
    g.add_argument(
        "--recipe",
        choices=RECIPE_NAMES,
        default=default_recipe,
        help="preset (default: mpp for --objective mpp, digits for --data digits, else auto: fitted to the data's "
        "size and the number of steps, printed when the run starts)",
    )
    g.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="passes over the training data (default: the recipe's; --time-budget plans its own)",
    )
    g.add_argument("--batch-size", type=int, default=None, help="global batch (all processes, all accumulation steps)")
    g.add_argument(
        "--lr", type=float, default=None, help="peak LR at the recipe's base batch (scaled linearly with --batch-size)"
    )
    g.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default=None)
    g.add_argument("--weight-decay", type=float, default=None)
    g.add_argument("--warmup-epochs", type=float, default=None)
    g.add_argument("--warmup-steps", type=int, default=None)
    g.add_argument("--schedule", choices=["cosine", "linear", "constant"], default=None)
    g.add_argument("--clip-grad", type=float, default=None, help="global-norm clipping (0: off)")
    g.add_argument("--accum-steps", type=int, default=None, help="gradient accumulation steps")
    g.add_argument("--ema", type=float, default=None, help="EMA decay of the weights, e.g. 0.999 (0: off)")
    g.add_argument("--label-smoothing", type=float, default=None)
    g.add_argument("--mixup", type=float, default=None, help="MixUp alpha (0: off)")
    g.add_argument("--cutmix", type=float, default=None, help="CutMix alpha (0: off)")
    g.add_argument(
        "--randaugment", type=_randaugment, default=None, metavar="N,M", help="RandAugment ops,magnitude or none"
    )
    g.add_argument("--random-erasing", type=float, default=None)
    g.add_argument("--hflip", type=float, default=None, help="horizontal flip probability")
    g.add_argument("--crop-scale", type=_pair, default=None, metavar="MIN,MAX", help="random resized crop area range")
    g.add_argument(
        "--layer-decay",
        type=float,
        default=None,
        metavar="D",
        help="layer-wise LR decay (BEiT, timm): block i of L at D**(L-i) x the LR, embeddings lowest, head 1 x",
    )
    g.add_argument(
        "--freeze",
        "--linear-probe",
        dest="freeze",
        action="store_true",
        default=None,
        help="train only the classifier head (a linear probe); every other weight stays as it was",
    )
    g.add_argument(
        "--head-warmup",
        type=int,
        default=None,
        metavar="STEPS",
        help="LP-FT: train only the head for the first STEPS optimizer steps, then every weight",
    )

    g = p.add_argument_group("distillation (DeiT, Touvron et al. 2021)")
    g.add_argument(
        "--teacher",
        default=None,
        metavar="MODEL_OR_RUN",
        help="distil from this trained classifier on the same classes (run or model folder, checkpoint, public "
        "name); frozen, it sees the same augmented images",
    )
    g.add_argument(
        "--distill",
        choices=["hard", "soft"],
        default=None,
        help="hard: cross-entropy with the teacher's argmax (default); soft: KL at --distill-tau x tau^2; "
        "either averaged with the label cross-entropy",
    )
    g.add_argument(
        "--distill-token",
        action="store_true",
        help="give the student DeiT's distillation token: its own head takes the teacher's target, the class head "
        "the labels (evaluation averages both)",
    )
    g.add_argument("--distill-tau", type=float, default=3.0, metavar="TAU", help="soft distillation's temperature")

    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="output folder (default: runs/<timestamp>-train)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    g.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "fp16"],
        default="auto",
        help="auto: bf16 autocast on GPU, fp32 on CPU",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="activation checkpointing per block: recompute each block in the backward pass, "
        "keeping only its input (less memory, one more forward; same gradients; see vitlab plan)",
    )
    g.add_argument(
        "--threads", type=int, default=0, help="CPU threads (0: 1 when a step is tiny, else torch's default)"
    )
    g.add_argument(
        "--time-budget",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="plan the schedule to end in e.g. 20m",
    )
    g.add_argument(
        "--save-every", type=float, default=None, metavar="MIN", help="also checkpoint every MIN minutes mid-epoch"
    )
    g.add_argument(
        "--stop-after", type=int, default=None, metavar="STEPS", help="save and stop after STEPS steps (resume later)"
    )
    g.add_argument("--keep", choices=["best", "last"], default="best", help="which weights model/ holds")
    g.add_argument(
        "--on-nan",
        choices=["stop", "skip"],
        default="stop",
        help="a NaN/Inf loss: stop before the update, keeping last.pt (exit 2), "
        "or skip the step and count it in metrics.jsonl",
    )
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its last.pt")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its metrics, summary, last.pt, model/ and figures are deleted first)",
    )
    g.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar or step lines (one line per epoch is still printed); off a terminal, plain lines "
        "replace the bar",
    )


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
        threads=args.threads,
        val_split=args.val_split,
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
            f"after {summary['epochs']} epochs / {summary['steps']} steps; {summary['wall_s']:.1f} s"
        )
        print(f"results in {summary['out']}/: metrics.jsonl summary.json curves.png model/ (headless ViT) last.pt")
        print(f"fine-tune it with: vitlab finetune --init {summary['out']}/model --data DATA")
    elif summary.get("top1") is not None and summary.get("processes", 1) >= 1 and _is_main():
        classes = (summary.get("data") or {}).get("classes", 0)
        top5 = f"top-5 {100 * summary['top5']:.2f}% " if classes > 5 else ""  # <= 5 classes: 100% by construction
        print(
            f"top-1 {100 * summary['top1']:.2f}% (best {100 * summary['best_top1']:.2f}%), "
            f"{top5}after {summary['epochs']} epochs / {summary['steps']} steps; "
            f"{summary['images_per_sec']:.0f} img/s; {summary['wall_s']:.1f} s"
        )
        print(f"results in {summary['out']}/: metrics.jsonl summary.json curves.png confusion.png model/ last.pt")
    if summary.get("interrupted") and args.stop_after is None:  # a stop signal: the shell's 128 + its number
        return 128 + (signal.Signals[summary["signal"]].value if summary.get("signal") else signal.SIGINT.value)
    return 0


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
