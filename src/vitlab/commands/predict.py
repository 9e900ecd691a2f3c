"""``vitlab predict``: the top-5 classes of images."""

from __future__ import annotations

import argparse

from ._common import add_device_arg


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
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
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

    import torch

    import vitlab

    from ..data.decode import read_image
    from ..devices import resolve_device
    from ..evaluate import model_inputs

    if args.top < 1:
        raise ValueError("--top must be >= 1")
    dev = resolve_device(args.device)  # before loading the model: a typo fails fast
    model = vitlab.load(args.model)
    cfg = model.config
    names = cfg.class_names or [str(i) for i in range(cfg.num_classes)]
    x = model_inputs(model, [read_image(p, max_pixels=args.max_image_pixels) for p in args.images])
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
