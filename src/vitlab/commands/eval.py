"""``vitlab eval``: top-1, top-5 and per-class accuracy of a model on a dataset, as JSON."""

from __future__ import annotations

import argparse

from ..train.conf.options import DATA_RULE, MEMORY_BUDGET_HELP
from ._common import add_device_arg, add_model_arg, add_progress_arg, add_serving_args, count


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "eval",
        help="top-1 / top-5 / per-class accuracy of a model on a dataset",
        description=(
            "Evaluate a model on the evaluation split of a dataset (val/ or test/; with --val-split, that\n"
            "fraction held out of the training images; a class folder with neither is evaluated whole, and\n"
            "the result says so, except the folder the model's run trained on: the fraction that run held out,\n"
            "the images that did not train it); print the result and write it as JSON (--output, default\n"
            "MODEL/eval.json), with the expected calibration error of the probabilities predict gives (ece: with\n"
            "the model's temperature; ece_uncalibrated: without). Without --data: the data the model's run\n"
            "trained on (its config records it), on the split the run evaluated; the embedded digits for a model\n"
            "that records none. A run's model/ on the folder it was trained on reads the decode cache training\n"
            "wrote (the same pixels).\n\n"
            "examples:\n"
            "  vitlab eval --model runs/20260101-120000-train           # the run's own evaluation split\n"
            "  vitlab eval --model runs/20260101-120000-train/model --data digits\n"
            "  vitlab eval --model runs/cifar/model --data path/to/cifar10 --output cifar_eval.json\n"
            "  vitlab eval --model runs/cifar/model --data path/to/cifar10 --tta flip   # image and mirror averaged\n"
            "  vitlab eval --model deploy/ --data path/to/cifar10     # a `vitlab export` folder (ONNX, int8 ...)"
        ),
        formatter_class=formatter,
    )
    add_model_arg(p)
    add_serving_args(p)
    p.add_argument(
        "--data",
        default=None,
        help="digits, cifar10, cifar100, an ImageFolder path, or tar shards (a `vitlab data pack` folder: its "
        "evaluation split; a pattern 'shards/val-{000000..000009}.tar': those shards). Default: the data the "
        f"model was trained on, else digits. {DATA_RULE}",
    )
    p.add_argument("--allow-pipe", action="store_true", help="let --data hold pipe: URLs, which run a shell command")
    p.add_argument("--split", choices=["val", "train"], default="val", help="val: the evaluation split (val/ or test/)")
    p.add_argument(
        "--val-split",
        type=float,
        default=None,
        help="evaluate this fraction held out of a folder without val/ or test/ (stratified, seed 0, as training "
        "holds it out); default: the whole folder, or the fraction the model's run held out of its own data",
    )
    p.add_argument("--batch-size", type=count, default=256, help="images per forward pass (default: 256)")
    p.add_argument(
        "--tta",
        choices=["none", "flip"],
        default="none",
        help="test-time augmentation: flip averages the logits of each image and its horizontal mirror",
    )
    add_device_arg(p)
    p.add_argument("--cache-dir", default=None, help="decoded-image cache (default ~/.cache/vitlab or $VITLAB_CACHE)")
    p.add_argument(
        "--strict-data",
        action="store_true",
        help="stop on files that cannot be used (not decodable, a broken link) instead of skipping them",
    )
    p.add_argument("--memory-budget", default="64M", metavar="SIZE", help=MEMORY_BUDGET_HELP)
    p.add_argument(
        "--output", default=None, help="JSON file to write (default: eval.json next to the model; none for a name)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    add_progress_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from .._text import shown
    from .._units import size_option
    from ..devices import resolve_device
    from ..evaluate import evaluate_model
    from ._common import default_output, model_data, resolve_model, write_json

    budget = size_option("--memory-budget", args.memory_budget)  # before loading the model: a typo fails fast
    device = resolve_device(args.device)
    model, _ = resolve_model(
        args.model, fast=True, exported=True, trust_torchscript=args.trust_torchscript, finite=True
    )
    if args.tome is not None:
        model.set_tome(args.tome)
    data, val_split, notes = model_data(model, args.model, args.data, val_split=args.val_split, split=args.split)
    res = evaluate_model(
        model,
        data,
        split=args.split,
        batch_size=args.batch_size,
        device=device,
        val_split=val_split,
        cache_dir=args.cache_dir,
        strict=args.strict_data,
        buffer_bytes=budget,
        allow_pipe=args.allow_pipe,
        tta=None if args.tta == "none" else args.tta,
        progress=not args.no_progress,
    )
    res["model"] = str(args.model)
    res["tta"] = args.tta
    for key in ("confusion", "confusion_cells"):  # (the latter: non-zero cells of a matrix too large to hold)
        if key in res:
            res[key] = res[key].tolist()
    notes += split_notes(res, args.model, data, val_split=val_split, asked=args.val_split is not None)
    for note in notes:  # --json: stdout is the JSON alone
        print(f"note: {shown(note)}", file=sys.stderr if args.json else sys.stdout)
    out = Path(args.output) if args.output else default_output(args.model, "eval.json")
    if out is not None:
        write_json(out, res)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    epoch = (model.config.extra or {}).get("epoch")
    weights = f" (epoch {epoch} of its run)" if type(epoch) is int else ""  # a run's model/ records its epoch
    print(
        f"{shown(args.model)}{weights} on {shown(data)} ({res['split']}, {res['count']:,} images): "
        f"top-1 {100 * res['top1']:.2f}%"
        + (f"  top-5 {100 * res['top5']:.2f}%" if len(res["class_names"]) > 5 else "")
        + ("  (flip TTA)" if args.tta == "flip" else "")
    )
    names = {shown(name): acc for name, acc in res["per_class"].items()}
    width = max(len(n) for n in names)
    for name, acc in names.items():
        print(f"  {name:<{width}}  {100 * acc:6.2f}%")
    print(calibration_line(res))
    if out is not None:
        print(f"wrote {shown(out)}")
    return 0


def calibration_line(res: dict) -> str:
    """The line ``vitlab eval`` prints about the probabilities ``vitlab predict`` gives: their expected calibration
    error (15 bins of top-1 confidence) with the model's temperature and without it."""

    def pct(v) -> str:
        return "-" if v is None else f"{100 * v:.2f}%"

    t = res.get("temperature", 1.0)
    how = f"temperature {t:.3g}" if t != 1.0 else "no temperature (T = 1)"
    return f"calibration: ECE {pct(res.get('ece'))} with {how}; {pct(res.get('ece_uncalibrated'))} uncalibrated"


def split_notes(res: dict, spec: str, data: str, *, val_split: float | None, asked: bool) -> list[str]:
    """What the evaluation split was when the data set has none of its own: the whole folder (``all``), or the
    fraction held out of it (by ``--val-split``, ``asked``; or the one the model's run held out of its own folder).
    Nothing for an evaluation split given itself (``DIR/test`` beside ``DIR/train``): it is evaluated whole. Tar
    shards hold out their last training shards, not a fraction of each class."""
    from ..data.sources import EVAL_DIRS, DataSource

    source = DataSource.named(data)
    if source.shards and val_split is not None:
        return [
            f"{data}: evaluated {res['count']:,} images of its last training shards ({val_split:.0%} of them, "
            "rounded, at least one), held out as training holds them out (--val-split)"
        ]
    if source.folder is None:
        return []
    if res["split"] == "all":
        if source.folder.name in EVAL_DIRS and (source.folder.parent / "train").is_dir():
            return []  # an evaluation split itself (clothing/test, as a run's "left alone" line suggests): all of it
        return [
            f"{data} has no val/ or test/ folder: all {res['count']:,} of its images were evaluated (--val-split F "
            "evaluates a fraction held out, as training holds it out)"
        ]
    if val_split is not None:
        why = "as --val-split asks" if asked else f"the images {spec}'s run held out (the others trained it)"
        return [
            f"{data} has no val/ or test/ folder: evaluated {res['count']:,} images held out of it ({val_split:.0%} "
            f"of each class, seed 0), {why}"
        ]
    return []
