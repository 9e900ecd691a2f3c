"""``vitlab predict``: the top-5 classes of images."""

from __future__ import annotations

import argparse

from ._common import add_device_arg, add_model_arg, add_serving_args


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "predict",
        help="top-5 class names with probabilities for image files",
        description=(
            "Classify image files with a trained model or a `vitlab export` folder (its own preprocessing:\n"
            "resize, center crop, mean/std from its config). Folders are searched for images; a file that\n"
            "cannot be read is reported on stderr and the others are still predicted (exit status 1 when any\n"
            "was skipped). The probabilities are calibrated: softmax(logits / T), T fitted by the model's run\n"
            "on held-out images (--uncalibrated: the plain softmax; the classes and their order are the same).\n\n"
            "examples:\n"
            "  vitlab predict --model runs/20260101-120000-train/model cat.jpg dog.png\n"
            "  vitlab predict --model runs/cifar images/ --json\n"
            "  vitlab predict --model deploy/ cat.jpg          # a `vitlab export` folder (ONNX, int8 ...)\n"
            "  vitlab predict --model runs/cifar/model --tome 8 images/   # token merging\n"
            "  vitlab predict --model runs/photos/model --native photos/  # each photo at its own aspect ratio"
        ),
        formatter_class=formatter,
    )
    p.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE",
        help="image files, folders (searched recursively) or patterns (photos/*.jpg, quoted or not)",
    )
    add_model_arg(p)
    add_serving_args(p)
    p.add_argument("--top", type=int, default=5, help="how many classes to show")
    p.add_argument(
        "--uncalibrated",
        action="store_true",
        help="the plain softmax of the logits; default: the calibrated probabilities, softmax(logits / T) with the "
        "temperature T the model's run fitted on held-out images (T = 1 for a model without one)",
    )
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--native",
        action="store_true",
        help="each image at its own aspect ratio (NaViT, packed): resized within the model's token budget, no "
        "square resize or crop (a vitlab model, not an exported folder)",
    )
    p.add_argument(
        "--native-res",
        type=float,
        default=None,
        metavar="PX",
        help="with --native: the token budget of a PX x PX image (default: the model's own resolution)",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=89_478_485,
        metavar="N",
        help="refuse larger images (decompression-bomb guard, PIL's limit)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    import torch

    from .._text import shown
    from ..data.images.user_files import image_files, read_image
    from ..devices import resolve_device
    from ..errors import CheckpointError, ConfigError, InputError
    from ..evaluate import model_inputs, native_inputs
    from ..evaluate.calibration import model_temperature, probabilities
    from ._common import resolve_model

    if args.top < 1:
        raise ValueError("--top must be >= 1")
    if args.native_res is not None and not args.native:
        raise ConfigError("--native-res: only with --native")
    if args.native and args.tome is not None:
        raise ConfigError("--native with --tome: token merging does not apply to packed images")
    dev = resolve_device(args.device)  # before loading the model: a typo fails fast
    left_out: list = []
    files = image_files(args.images, left_out=left_out)  # folders searched; a missing path fails before the model loads
    if left_out:
        print(f"note: left out {len(left_out)} file(s): {shown(str(left_out[0][0]))}: {left_out[0][1]}"
              + (" ..." if len(left_out) > 1 else ""), file=sys.stderr)  # fmt: skip
    model, _ = resolve_model(args.model, fast=True, exported=True, trust_torchscript=args.trust_torchscript)
    if args.tome is not None:
        model.set_tome(args.tome)
    if args.native and not hasattr(model, "forward_packed"):
        raise ConfigError(f"--native: {args.model} is an exported folder; pass the vitlab model it was exported from")
    model.to(dev)
    temperature = 1.0 if args.uncalibrated else model_temperature(model)
    cfg = model.config
    names = cfg.class_names or [str(i) for i in range(cfg.num_classes)]
    k = min(args.top, cfg.num_classes)
    batch = batch_size(cfg)
    results: list[dict] = []
    for start in range(0, len(files), batch):  # in batches: a folder of many images never sits in memory at once
        entries, arrays = [], []
        for f in files[start : start + batch]:
            try:
                arrays.append(read_image(f, max_pixels=args.max_image_pixels))
                entries.append({"image": str(f)})
            except InputError as e:  # reported, and the rest still predicted
                results.append({"image": str(f), "error": str(e)})
        if not arrays:
            continue
        native = args.native
        x = native_inputs(model, arrays, resolution=args.native_res) if native else model_inputs(model, arrays)
        with torch.no_grad():
            logits = model(x.to(dev)).float()
        if not bool(torch.isfinite(logits).all()):
            raise CheckpointError(
                f"--model {args.model}: the model answers NaN or infinity (non-finite weights?); no prediction made"
            )
        probs = probabilities(logits, temperature).cpu()
        for entry, ps, ix in zip(entries, *probs.topk(k, dim=1)):
            top = [{"class": names[int(i)], "index": int(i), "prob": round(float(p), 6)} for p, i in zip(ps, ix)]
            results.append({**entry, "top": top})
    order = {str(f): i for i, f in enumerate(files)}
    results.sort(key=lambda r: order[r["image"]])
    failed = [r for r in results if "error" in r]
    if len(failed) == len(results):
        raise InputError(failed[0]["error"] + ("" if len(failed) == 1 else f" (and {len(failed) - 1} more unreadable)"))
    if args.json:
        print(json.dumps(results, indent=2))
    else:  # paths and class names from files, shown escaped (a name may hold a terminal's control sequences)
        for r in results:
            if "top" in r:
                print(f"{shown(r['image'])}: " + ", ".join(f"{shown(t['class'])} {t['prob']:.3f}" for t in r["top"]))
    for r in failed:
        print(f"vitlab predict: skipped {shown(r['error'])}", file=sys.stderr)
    if failed:
        print(f"vitlab predict: {len(failed)} of {len(results)} files unreadable", file=sys.stderr)
    return 1 if failed else 0


_BATCH = 64
_BATCH_BYTES = 256 << 20
"""At most this many bytes of model inputs at once (float32, ``C x H x W`` each): 64 images of a ViT-B at 224 px
take 38 MB; a 2048 px model's take 50 MB each, so its batch is 5."""


def batch_size(cfg) -> int:
    """Images per batch for a model of config ``cfg``: :data:`_BATCH`, fewer when their inputs would pass
    :data:`_BATCH_BYTES`."""
    h, w = cfg.img_size
    return max(1, min(_BATCH, _BATCH_BYTES // max(1, 4 * cfg.in_chans * h * w)))
