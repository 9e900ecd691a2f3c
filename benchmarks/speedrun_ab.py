"""What separates the speedrun's ``vit`` track from the plain timm script (``speedrun_timm.py``), one factor at a
time: both models trained by the same loop (the timm script's: AdamW 2e-3, warmup 0.3 epochs + cosine over a fixed
number of steps, label smoothing 0.1, clipping at 1, batch 128, crop 0.6-1 + flip) for the same steps, then
evaluated on every test image. The factors:

- ``--model timm|vitlab``: ``timm.models.VisionTransformer`` or vitlab's (width 128, depth 6, 4 heads, MLP 256,
  4x4 patches, GAP without a class token, learned position embeddings: the timm script's architecture);
- ``--init native|timm``: vitlab's model as built (the official JAX initialisation) or re-initialised as timm does
  (truncated normal 0.02 for every dense layer, PyTorch's default for the patch projection);
- ``--fc-norm 0|1``: the final LayerNorm on every token before pooling (vitlab's default) or after (timm's);
- ``--norm data|inception``: inputs normalised by the training set's mean / std or by 0.5 / 0.5;
- ``--decay all|matrices``: weight decay on every parameter (the plain script) or on matrices only (vitlab);
- ``--pipeline vitlab|torchvision``: the decode cache + ``transforms.v2`` on uint8 tensors, or torchvision's
  ``ImageFolder`` re-decoding each JPEG with PIL every epoch.

    python benchmarks/speedrun_ab.py --data ../shared/data/cifar10 --steps 1000 --model vitlab --norm inception
    python benchmarks/speedrun_ab.py --smoke      # tiny generated data, seconds: what CI runs

The last stdout line is one JSON object: the factors, ``steps``, ``top1``, ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import Stopwatch, speedrun_timm_model, speedrun_vit_kwargs, tiny_data
from torch import nn

CIFAR_SIZE = 32


def build(model: str, *, init: str, fc_norm: bool, img: int, classes: int, smoke: bool) -> nn.Module:
    """The timm script's architecture from timm or from vitlab, with the given initialisation and LayerNorm."""
    if model == "timm":
        return speedrun_timm_model(img=img, classes=classes, smoke=smoke, fc_norm=fc_norm)
    from vitlab.models import VisionTransformer

    kw = speedrun_vit_kwargs(img=img, classes=classes, smoke=smoke, fc_norm=fc_norm)
    m = VisionTransformer(**kw, mlp_dim=2 * kw["embed_dim"], pool="gap", posemb="learn")
    if init == "timm":
        with torch.no_grad():
            for layer in m.modules():
                if isinstance(layer, nn.Linear):
                    nn.init.trunc_normal_(layer.weight, std=0.02)
                    nn.init.zeros_(layer.bias)
            m.patch_embed.proj.reset_parameters()
            nn.init.trunc_normal_(m.pos_embed, std=0.02)
    return m


def datasets(root: Path, *, pipeline: str, norm: str, img: int, cache: str | None = None):
    """``(train, test, number of classes)``: map-style datasets of normalised float images."""
    from vitlab.data import ArrayDataset, channel_stats, eval_transform, load_data, train_transform

    splits = load_data(str(root), cache_dir=cache)
    if norm == "data":
        mean, std = channel_stats(splits.train.images, in_chans=3)
    else:
        mean, std = (0.5,) * 3, (0.5,) * 3
    if pipeline == "torchvision":
        from torchvision import datasets as tvd
        from torchvision import transforms as T

        aug = [T.RandomResizedCrop(img, scale=(0.6, 1.0)), T.RandomHorizontalFlip()]
        tail = [T.ToTensor(), T.Normalize(mean, std)]
        test = next(p for p in (root / "test", root / "val") if p.is_dir())
        train = tvd.ImageFolder(str(root / "train"), T.Compose(aug + tail))
        return train, tvd.ImageFolder(str(test), T.Compose(tail)), splits.num_classes
    tf = train_transform(img_size=img, mean=mean, std=std, crop_scale=(0.6, 1.0), hflip=0.5)
    return (
        ArrayDataset(splits.train.images, splits.train.labels, transform=tf),
        ArrayDataset(splits.val.images, splits.val.labels, transform=eval_transform(img_size=img, mean=mean, std=std)),
        splits.num_classes,
    )


def run(args: argparse.Namespace, root: Path, *, cache: str | None = None) -> dict:
    """Train ``args.steps`` steps with the timm script's loop and evaluate every test image once."""
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    img = 8 if args.smoke else CIFAR_SIZE
    train, test, classes = datasets(root, pipeline=args.pipeline, norm=args.norm, img=img, cache=cache)
    batch = 8 if args.smoke else 128
    gen = torch.Generator().manual_seed(args.seed)
    tl = torch.utils.data.DataLoader(
        train, batch_size=batch, shuffle=True, drop_last=True, num_workers=1, persistent_workers=True, generator=gen
    )
    model = build(args.model, init=args.init, fc_norm=bool(args.fc_norm), img=img, classes=classes, smoke=args.smoke)
    named = list(model.named_parameters())
    if args.decay == "all":
        groups = [{"params": [p for _, p in named], "weight_decay": 0.05}]
    else:
        matrix = [p for n, p in named if p.ndim > 1 and "pos_embed" not in n]
        rest = [p for n, p in named if not (p.ndim > 1 and "pos_embed" not in n)]
        groups = [{"params": matrix, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=2e-3)
    warm = max(1, min(args.steps - 1, round(0.3 * len(tl))))
    step, clock = 0, Stopwatch()
    model.train()
    while step < args.steps:
        for x, y in tl:
            t = step / warm if step < warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / (args.steps - warm)))
            for g in opt.param_groups:
                g["lr"] = 2e-3 * t
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step >= args.steps:
                break
    model.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(test, batch_size=500):
            correct += (model(x).argmax(1) == y).sum().item()
            n += len(y)
    return {"top1": correct / n, "seconds": round(clock.elapsed(), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=None, help="ImageFolder with train/ and test/ (e.g. ../shared/data/cifar10)")
    p.add_argument("--model", choices=["timm", "vitlab"], default="vitlab")
    p.add_argument("--init", choices=["native", "timm"], default="native")
    p.add_argument("--fc-norm", type=int, choices=[0, 1], default=0)
    p.add_argument("--norm", choices=["data", "inception"], default="data")
    p.add_argument("--decay", choices=["all", "matrices"], default="matrices")
    p.add_argument("--pipeline", choices=["vitlab", "torchvision"], default="vitlab")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: two runs share 2 cores)")
    p.add_argument("--smoke", action="store_true", help="tiny generated data and model, a few steps")
    args = p.parse_args(argv)
    if not args.smoke and not args.data:
        p.error("--data DIR is required (or --smoke)")
    if args.smoke:
        args.steps = min(args.steps, 4)
    with tempfile.TemporaryDirectory(prefix="speedrun-ab-") as tmp:
        root = tiny_data(Path(tmp) / "data") if args.smoke else Path(args.data)
        cache = str(Path(tmp) / "cache") if args.smoke else None
        row = {k: v for k, v in vars(args).items() if k not in ("data", "threads")} | run(args, root, cache=cache)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
