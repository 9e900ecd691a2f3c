"""``vitlab inspect``: the paper's Fig. 6 and Fig. 7 for a model, as PNGs and one report.html."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..train.conf.options import DATA_RULE
from ._common import add_device_arg, add_model_arg, add_progress_arg, count


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "inspect",
        help="figures 6 and 7 of the paper (filters, position embeddings, attention distance, rollout) + HTML report",
        description=(
            "Analyse a ViT as in Sec. 4.5 of the paper and write PNG figures, inspect.json and a\n"
            "self-contained report.html (images embedded; open it in any browser, no server):\n"
            "  Fig. 7 left    principal components of the patch-embedding filters\n"
            "  Fig. 7 center  cosine similarity of the position embeddings\n"
            "  Fig. 7 right   mean attention distance of every head at every layer\n"
            "  Fig. 6         attention rollout from the output token, and the raw per-layer attention\n"
            "plus the training curves and confusion matrix when --model is a `vitlab train --out` folder.\n"
            "Without --image or --data: the data a run was trained on (its config records it; an error naming\n"
            "--data when that is gone), or for an architecture name a few embedded digits (--data digits).\n\n"
            "examples:\n"
            "  vitlab inspect --model runs/digits --out inspect/\n"
            "  vitlab inspect --model vit_ti16 --image cat.jpg dog.jpg --out inspect/\n"
            "  vitlab inspect --model runs/flowers photos/rose.jpg      # images as vitlab predict takes them\n"
            "  vitlab inspect --model runs/cifar/model --data path/to/cifar10 --num-images 256 --out inspect/"
        ),
        formatter_class=formatter,
    )
    add_model_arg(p)
    p.add_argument(
        "--image", nargs="+", action="extend", default=[], metavar="IMG", help="image files or folders to analyse"
    )
    p.add_argument(
        "images", nargs="*", default=[], metavar="IMAGE", help="the same as --image (as vitlab predict takes them)"
    )
    p.add_argument(
        "--data",
        default=None,
        help="take the images from this data set's evaluation split (val/ or test/; digits, cifar10, a folder); "
        f"default: the data the model was trained on. {DATA_RULE}",
    )
    p.add_argument(
        "--out", default=None, help="output folder (default: inspect/ next to the model; ./inspect for a name)"
    )
    p.add_argument("--num-images", type=int, default=32, help="images the mean attention distance is averaged over")
    p.add_argument("--show", type=int, default=4, help="images shown in the rollout figures")
    p.add_argument("--img-size", type=int, default=None, help="input resolution; None = the model's")
    add_device_arg(p)
    p.add_argument(
        "--batch-size", type=count, default=32, help="images per forward pass of the attention distances (default: 32)"
    )
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    add_progress_arg(p)
    p.set_defaults(func=run)


def _registered(spec: str) -> bool:
    from ..models import list_models
    from ..models.registry import resolve_name

    return resolve_name(spec) in list_models()


_ASK = "pass --data with its location, --image FILE ..., or --data digits for the embedded digits"


def run(args: argparse.Namespace) -> int:
    from .._fs import own_folder
    from .._text import shown
    from ..data.sources import DataSource
    from ..devices import resolve_device
    from ..errors import ConfigError, DataError
    from ..evaluate.accuracy import decode_crop, decode_size
    from ..inspect.images import digits_images, read_images, sample_split
    from ..inspect.report import inspect_model
    from ..resolve import recorded_data
    from ._common import default_output, resolve_model

    for opt in ("num_images", "show", "batch_size"):
        if getattr(args, opt) <= 0:
            raise ConfigError(f"--{opt.replace('_', '-')} must be positive, got {getattr(args, opt)}")
    device = resolve_device(args.device)  # before loading the model: a typo fails fast
    if args.out is None and (default := default_output(args.model, "inspect")) is not None and default.is_symlink():
        own_folder(default, what="the report")  # the default folder, in the model's folder: never written into
    args.out = str(args.out or default_output(args.model, "inspect") or "inspect")
    model, model_dir = resolve_model(args.model, img_size=args.img_size, finite=True)
    model.to(device)
    notes, recorded = [], False
    if not Path(args.model).exists() and _registered(args.model):
        notes.append(
            f"The weights are random: {args.model} is an architecture name, not a trained model, so the figures "
            "show an untrained network."
        )
    given = [*args.image, *args.images]  # --image and the images after the options
    if not given and not args.data:
        if notes:  # a bare architecture: no data of its own
            notes.append("Images: the embedded scikit-learn digits (no --image or --data given).")
        else:
            args.data = recorded_data(model, args.model, ask=_ASK)
            recorded = True
    if args.data and DataSource.named(args.data).shards:
        where = f"{shown(args.model)} was trained on tar shards" if recorded else f"{shown(args.data)}: tar shards"
        raise DataError(f"--data: {where}, which inspect does not read; {_ASK}")
    if given:
        images, names = read_images(given)
        distance_images = images[: args.num_images]
    elif args.data:  # only the images shown and measured are decoded, as the evaluation decodes them
        saved = (model.config.extra or {}).get("val_split") if recorded else None
        distance_images, names, split = sample_split(
            args.data,
            max(args.num_images, args.show),
            size=decode_size(model),
            crop=decode_crop(model),
            val_split=saved if type(saved) is float else None,
        )
        if not distance_images:
            raise DataError(f"--data {shown(args.data)}: none of the images of its evaluation split can be decoded")
        if recorded:
            notes.append(
                f"Images: the {split} split of the data the model was trained on ({args.data}, from its config)."
            )
        images = distance_images
    else:
        distance_images, names = digits_images(max(args.num_images, args.show))
        images = distance_images
    for n in notes:
        print(f"note: {shown(n)}", file=sys.stderr if args.json else sys.stdout)  # --json: stdout is the JSON alone
    result = inspect_model(
        model,
        images[: args.show],
        args.out,
        names=names[: args.show],
        distance_images=distance_images[: args.num_images],
        model_dir=model_dir,
        batch_size=args.batch_size,
        max_display=args.show,
        notes=notes,
        progress=not args.no_progress,
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report = Path(args.out) / "report.html"
        dist = result["mean_attention_distance"]["per_layer_head"]
        print(
            f"mean attention distance (px), layer 1: {min(dist[0]):.1f}-{max(dist[0]):.1f}, "
            f"layer {len(dist)}: {min(dist[-1]):.1f}-{max(dist[-1]):.1f}"
        )
        print(f"wrote {len(result['files'])} files to {shown(args.out)}; open {shown(report)}")
    return 0
