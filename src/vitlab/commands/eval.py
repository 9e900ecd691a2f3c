"""``vitlab eval``: top-1, top-5 and per-class accuracy of a model on a dataset, as JSON."""

from __future__ import annotations

import argparse

from ..train.spec.options import MEMORY_BUDGET_HELP
from ._common import add_device_arg, add_model_arg, add_serving_args


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "eval",
        help="top-1 / top-5 / per-class accuracy of a model on a dataset",
        description=(
            "Evaluate a model on the evaluation split (val/ or test/, or the held-out --val-split) of a\n"
            "dataset; print the result and write it as JSON (--output, default MODEL/eval.json). A run's model/\n"
            "on the folder it was trained on reads the decode cache training wrote (the same pixels).\n\n"
            "examples:\n"
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
        default="digits",
        help="digits, cifar10, cifar100, an ImageFolder path, or tar shards (a `vitlab data pack` folder: its "
        "evaluation split; a pattern 'shards/val-{000000..000009}.tar': those shards)",
    )
    p.add_argument("--allow-pipe", action="store_true", help="let --data hold pipe: URLs, which run a shell command")
    p.add_argument("--split", choices=["val", "train"], default="val", help="val: the evaluation split (val/ or test/)")
    p.add_argument("--val-split", type=float, default=None, help="held-out fraction for a folder without val/ or test/")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument(
        "--tta",
        choices=["none", "flip"],
        default="none",
        help="test-time augmentation: flip averages the logits of each image and its horizontal mirror",
    )
    add_device_arg(p)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--strict-data", action="store_true")
    p.add_argument("--memory-budget", default="64M", metavar="SIZE", help=MEMORY_BUDGET_HELP)
    p.add_argument(
        "--output", default=None, help="JSON file to write (default: eval.json next to the model; none for a name)"
    )
    p.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .._units import size_option
    from ..devices import resolve_device
    from ..evaluate import evaluate_model
    from ._common import default_output, resolve_model, write_json

    budget = size_option("--memory-budget", args.memory_budget)  # before loading the model: a typo fails fast
    device = resolve_device(args.device)
    model, _ = resolve_model(args.model, fast=True, exported=True, trust_torchscript=args.trust_torchscript)
    if args.tome is not None:
        model.set_tome(args.tome)
    res = evaluate_model(
        model,
        args.data,
        split=args.split,
        batch_size=args.batch_size,
        device=device,
        val_split=args.val_split,
        cache_dir=args.cache_dir,
        strict=args.strict_data,
        buffer_bytes=budget,
        allow_pipe=args.allow_pipe,
        tta=None if args.tta == "none" else args.tta,
    )
    res["model"] = str(args.model)
    res["tta"] = args.tta
    for key in ("confusion", "confusion_cells"):  # (the latter: non-zero cells of a matrix too large to hold)
        if key in res:
            res[key] = res[key].tolist()
    out = Path(args.output) if args.output else default_output(args.model, "eval.json")
    if out is not None:
        write_json(out, res)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    epoch = (model.config.extra or {}).get("epoch")
    weights = f" (epoch {epoch} of its run)" if type(epoch) is int else ""  # a run's model/ records its epoch
    print(
        f"{args.model}{weights} on {args.data} ({res['split']}, {res['count']:,} images): "
        f"top-1 {100 * res['top1']:.2f}%"
        + (f"  top-5 {100 * res['top5']:.2f}%" if len(res["class_names"]) > 5 else "")
        + ("  (flip TTA)" if args.tta == "flip" else "")
    )
    width = max(len(n) for n in res["per_class"])
    for name, acc in res["per_class"].items():
        print(f"  {name:<{width}}  {100 * acc:6.2f}%")
    if out is not None:
        print(f"wrote {out}")
    return 0
