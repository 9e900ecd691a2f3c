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
    p.add_argument("--model", required=True, help="a vitlab model folder (e.g. runs/X/model) or anything vitlab.load reads")
    p.add_argument("--top", type=int, default=5, help="how many classes to show")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def read_image(path: str, in_chans: int):
    """An image file as a ``(C, H, W)`` uint8 tensor with the model's channel count."""
    import numpy as np
    import torch
    from PIL import Image

    from ..data.transforms import match_channels
    from ..errors import InputError

    try:
        with Image.open(path) as im:
            if im.mode in ("P", "PA", "LA", "RGBA"):
                im = Image.alpha_composite(Image.new("RGBA", im.size, (255, 255, 255, 255)), im.convert("RGBA"))
            im = im.convert("L" if in_chans == 1 else "RGB")
            arr = np.asarray(im, dtype=np.uint8)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except Exception as e:
        raise InputError(f"{path}: not a readable image ({type(e).__name__})") from None
    x = torch.from_numpy(arr.copy())
    x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)
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
    x = torch.stack([tf(read_image(p, cfg.in_chans)) for p in args.images])
    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev)
    with torch.no_grad():
        probs = model(x.to(dev)).float().softmax(-1).cpu()
    k = min(args.top, probs.shape[1])
    top = probs.topk(k, dim=1)
    results = [
        {"image": path, "top": [{"class": names[int(i)], "index": int(i), "prob": round(float(p), 6)} for p, i in zip(ps, ix)]}
        for path, ps, ix in zip(args.images, top.values, top.indices)
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        print(f"{r['image']}: " + ", ".join(f"{t['class']} {t['prob']:.3f}" for t in r["top"]))
    return 0
