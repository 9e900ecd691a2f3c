"""``vitlab predict``: the top-5 classes of images."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction, formatter: type[argparse.HelpFormatter]) -> None:
    p = sub.add_parser(
        "predict",
        help="top-5 class names with probabilities for image files",
        description=(
            "Classify image files with a trained model (its own preprocessing: resize, center crop,\n"
            "mean/std from its config).\n\n"
            "examples:\n"
            "  vitlab predict --model runs/20260101-120000-train/model cat.jpg dog.png\n"
            "  vitlab predict --model runs/cifar/model images/*.jpg --json"
        ),
        formatter_class=formatter,
    )
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    p.add_argument(
        "--model", required=True, help="a vitlab model folder (e.g. runs/X/model) or anything vitlab.load reads"
    )
    p.add_argument("--top", type=int, default=5, help="how many classes to show")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=89_478_485,
        metavar="N",
        help="refuse larger images (decompression-bomb guard, PIL's limit)",
    )
    p.set_defaults(func=run)


def read_image(path: str, in_chans: int, *, max_pixels: int | None = None):
    """An image file as a ``(C, H, W)`` uint8 tensor with the model's channel count; a file that
    cannot be used raises a one-line :class:`~vitlab.errors.InputError` naming it and the reason."""
    import os

    import torch

    from ..data.cache import decode_image
    from ..data.transforms import match_channels
    from ..errors import InputError

    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    try:
        arr = decode_image(path, mode="L" if in_chans == 1 else "RGB", max_pixels=max_pixels)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise InputError(f"{path}: not a readable image ({type(e).__name__}{': ' + why if why else ''})") from None
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1)
    return match_channels(x, in_chans)


def run(args: argparse.Namespace) -> int:
    import json

    import torch

    import vitlab

    from ..evaluate import preprocess_for

    if args.top < 1:
        raise ValueError("--top must be >= 1")
    model = vitlab.load(args.model)
    cfg = model.config
    names = cfg.class_names or [str(i) for i in range(cfg.num_classes)]
    tf = preprocess_for(model)
    x = torch.stack([tf(read_image(p, cfg.in_chans, max_pixels=args.max_image_pixels)) for p in args.images])
    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev)
    with torch.no_grad():
        probs = model(x.to(dev)).float().softmax(-1).cpu()
    k = min(args.top, probs.shape[1])
    top = probs.topk(k, dim=1)
    results = [
        {
            "image": path,
            "top": [{"class": names[int(i)], "index": int(i), "prob": round(float(p), 6)} for p, i in zip(ps, ix)],
        }
        for path, ps, ix in zip(args.images, top.values, top.indices)
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(f"{r['image']}: " + ", ".join(f"{t['class']} {t['prob']:.3f}" for t in r["top"]))
    return 0
