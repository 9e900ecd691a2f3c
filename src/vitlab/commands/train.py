"""``vitlab train``: train a ViT (the main job: no arguments trains on the embedded digits)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .._units import counted
from ..train.conf.parser import add_options

EXAMPLES = """examples:
  vitlab train                                   # the main job: embedded 8x8 digits, < 60 s on 2 CPU cores
  vitlab train --data path/to/imagefolder --epochs 10   # recipe auto: fitted to the data and the 10 epochs
  vitlab train --data path/to/imagefolder --model vit_ti16 --img-size 64 --epochs 30
  vitlab train --data path/to/cifar10 --recipe small-data --dim 192 --depth 6 --time-budget 20m
  vitlab train --out runs/cifar --resume         # continue a stopped run at the same step
  vitlab train --config runs/cifar/config.yaml --out runs/again   # that run again, from its config file
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
            "model/ (vitlab folder), last.pt (exact resume) and config.yaml (--config re-creates the run) under\n"
            "--out. Ctrl-C, SIGTERM and SIGHUP save and stop.\n"
            "Recipes: auto (the default for --data DIR: fitted to the data's size and the budget), digits (default\n"
            "job), small-data (from scratch on small datasets), pretrain (paper), finetune (paper); every flag\n"
            "overrides its recipe.\n\n" + EXAMPLES
        ),
        formatter_class=formatter,
    )
    add_options(p, command="train")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .._fs import removed_if_unused
    from .._text import shell_word, shown
    from ..errors import ConfigError
    from ..train import fit
    from ..train.conf.config_file import Sources, merge, read_config_file
    from ..train.conf.options import OptionError, overwrite_target, pipe_trusted
    from ..train.conf.parser import namespace_values
    from ..train.conf.rules import check_locations
    from ..train.conf.train_config import build_config
    from ..train.engine.signals import StoppedBeforeTraining

    if args.resume and not args.out:
        raise ConfigError("--resume needs --out DIR (the run to continue)")
    if args.resume and args.config:
        raise ConfigError("--config with --resume: a resumed run is the one saved in --out; drop --config")
    if args.replan and not args.config:
        raise ConfigError("--replan applies to --config runs/X/config.yaml: it chooses afresh instead of reading X's "
                          "sizing.json; give --config, or drop --replan")  # fmt: skip
    values, given = namespace_values(args, command=args.command)
    typed = set(given)  # typed on this command line (the config file's keys join `given` below, never this)
    values["allow_pipe"] = pipe_trusted(values.get("allow_pipe", False), typed)  # one rule: fresh, --config, resume
    sources = Sources()
    replay = None
    if args.config:  # the flags given over the file's values
        values, given, sources = merge(values, given, read_config_file(args.config), path=args.config)
        replay = None if args.replan else _sizing_beside(Path(args.config))
    try:
        cfg = build_config(values, given=given)
        check_locations(cfg)  # before anything looks at a folder (a name too long to exist)
        overwrite = overwrite_target(args.overwrite, typed, out=str(cfg.out), file=args.config)
        with removed_if_unused(cfg.out):  # a run that fails before writing anything leaves no empty folder
            summary = fit(cfg, resume=args.resume, given=given, overwrite=overwrite, replay=replay)
    except OptionError as e:  # named as the user gave it: the flag, or the config file's key
        raise ConfigError(sources.explain(e)) from None
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
        out = shown(summary["out"])
        print(f"results in {out}/: metrics.jsonl summary.json curves.png model/ (headless ViT) last.pt")
        print(f"fine-tune it with: vitlab finetune --init {shell_word(Path(summary['out']) / 'model')} --data DATA")
    elif summary.get("top1") is not None and summary.get("processes", 1) >= 1 and _is_main():
        print(result_line(summary))
        if line := calibration_summary(summary):
            print(line)
        health = "health.png " if (Path(summary["out"]) / "health.png").is_file() else ""  # --watch-attention
        reliability = "reliability.png " if (Path(summary["out"]) / "reliability.png").is_file() else ""
        adapters = " adapters/" if (Path(summary["out"]) / "adapters").is_dir() else ""  # --keep-adapters
        print(
            f"results in {shown(summary['out'])}/: metrics.jsonl summary.json curves.png {health}confusion.png "
            f"{reliability}model/{adapters} last.pt"
        )
    return exit_status(summary)


def calibration_summary(summary: dict) -> str | None:
    """The line a run prints about its calibration (``summary["calibration"]``, fitted when ``model/`` was saved):
    the temperature, the ECE with it and without it, and on which images; None when this process fitted none."""
    cal = summary.get("calibration")
    if not isinstance(cal, dict) or cal.get("ece") is None:
        return None
    split = (summary.get("eval") or {}).get("split", "evaluation")
    fitted = cal.get("fitted_temperature", cal["temperature"])
    shown = next((f"{fitted:.{n}g}" for n in range(3, 18) if f"{fitted:.{n}g}" != f"{cal['temperature']:.3g}"), "")
    why = cal.get("why_not") or "it did not pay out of sample"
    kept = "" if fitted == cal["temperature"] else f", not the fitted {shown}: {why}"  # not "1"
    return (
        f"calibration: temperature {cal['temperature']:.3g}{kept} (model/config.json; vitlab predict's probabilities), "
        f"ECE {100 * cal['ece']:.1f}% (uncalibrated {100 * cal['ece_uncalibrated']:.1f}%) on {cal['ece_images']:,} "
        f"{split} images; fitted on the other {cal['fit_images']:,} (every other image)"
    )


def exit_status(summary: dict) -> int:
    """A run's exit status: 128 + the signal's number when a stop signal stopped it (the shell's convention), else 0
    (finished, or a planned stop: ``--stop-after`` typed or a config file's ``stop_after``, one rule)."""
    if summary.get("interrupted") and summary.get("signal") in signal.Signals.__members__:
        return 128 + signal.Signals[summary["signal"]].value
    return 0


def _sizing_beside(config: Path) -> dict | None:
    """What the run whose ``config.yaml`` is ``config`` chose (its ``sizing.json``, read as data), with where it was
    read (``"where"``), for the new run to read back; None where there is none. A ``sizing.json`` that is not one is
    refused in one line (``--replan`` chooses afresh instead)."""
    from ..errors import ConfigError
    from ..train.sizing import SIZING_FILE, read_sizing

    try:
        rec = read_sizing(config.parent)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{config.parent / SIZING_FILE}: cannot read what that run chose ({e}); "
                          "--replan to choose afresh") from None  # fmt: skip
    return None if rec is None else {**rec, "where": str(config.parent / SIZING_FILE)}


def result_line(summary: dict) -> str:
    """The line a classification run ends with: the top-1 of the weights ``model/`` holds (what ``vitlab eval``
    gives for them), on which split and how many images, with its standard error; the epoch they come from; the best
    epoch when it is another and better."""
    classes = (summary.get("data") or {}).get("classes", 0)
    top5 = f", top-5 {100 * summary['top5']:.2f}%" if classes > 5 else ""  # <= 5 classes: 100% by construction
    ev = summary.get("eval") or {}
    on = f" on {ev['split']} ({counted(ev['images'], 'image')}, +/-{ev['top1_stderr']:.1f})" if ev.get("images") else ""
    kept = f"model/: epoch {summary['model_epoch']}" if summary.get("model_epoch") else "model/"
    if summary.get("keep") == "best":
        kept += f" (--keep best: chosen on {ev.get('split', 'the evaluation split')})"
    elif (summary.get("best_top1") or 0) > summary["top1"]:
        kept += f"; best {100 * summary['best_top1']:.2f}% at epoch {summary['best_epoch']}"
    return (
        f"top-1 {100 * summary['top1']:.2f}%{on}{top5} after {counted(summary['epochs'], 'epoch')} / "
        f"{counted(summary['steps'], 'step')}; {kept}; {summary['images_per_sec']:.0f} img/s; {summary['wall_s']:.1f} s"
    )


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
