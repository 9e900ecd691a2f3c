"""The options of ``vitlab train`` and ``vitlab finetune``: one parser definition both commands share,
and which of its flags a user actually gave (``--resume`` compares those with the saved run)."""

from __future__ import annotations

import argparse
import re

__all__ = ["MEMORY_BUDGET_HELP", "RECIPE_NAMES", "add_train_args", "parse_duration"]

RECIPE_NAMES = [
    "auto",
    "digits",
    "small-data",
    "pretrain",
    "finetune",
    "mpp",
]  # mirrors vitlab.train.recipes (kept import-free)


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
        help="digits (embedded), cifar10, cifar100 (torchvision, online), an ImageFolder path, or tar shards: "
        "a folder `vitlab data pack` wrote or a pattern 'shards/train-{000000..000099}.tar' (streamed, not cached)",
    )
    g.add_argument(
        "--allow-pipe",
        action="store_true",
        help="let --data hold pipe: URLs ('pipe:curl -sfL https://host/train-{000000..000099}.tar'), which run a "
        "shell command; never taken from a resumed run's last.pt: give it, and the same --data, again",
    )
    g.add_argument(
        "--shuffle-buffer",
        type=int,
        default=8192,
        metavar="N",
        help="tar shards: samples shuffled together (the window of each epoch's order; bounds the reader's memory)",
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
    g.add_argument(
        "--norm-stats",
        choices=["data", "inception", "imagenet"],
        default=None,
        help="input normalisation of a model trained from scratch: the training set's per-channel mean/std "
        "(default), 0.5/0.5 (Google's checkpoints) or ImageNet's; an --init model keeps its own",
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
        "--token-drop-until",
        type=float,
        default=None,
        metavar="F",
        help="with --token-drop: drop tokens for the first fraction F of the steps and train the rest on every "
        "token (FLIP's unmasked tuning), e.g. 0.9",
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
        "--fsdp",
        action="store_true",
        help="shard weights, gradients and optimizer state over the processes (FSDP2, per block; bf16 on GPU) "
        "instead of DDP; checkpoints resume on any number of processes. Under torchrun, or alone: "
        "torchrun --nproc_per_node 8 -m vitlab train --fsdp --grad-checkpointing ... (see docs/scale.md)",
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
