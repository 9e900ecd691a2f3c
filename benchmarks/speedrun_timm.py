"""The baseline row of ``benchmarks/speedrun.py --baseline timm``: what a careful user of timm writes for a fixed
wall budget, with the same model size and recipe as the speedrun's ``vit`` track and none of vitlab.

``timm.models.VisionTransformer`` (4x4 patches, width 128, depth 6, 4 heads, MLP ratio 2, global average pooling,
no class token, timm's learned position embeddings), torchvision's ``ImageFolder`` with ``RandomResizedCrop``
(scale 0.6-1) + flip in two DataLoader workers, AdamW 2e-3 (weight decay 0.05), label smoothing 0.1, gradient
clipping at 1, linear warmup over 0.3 epochs then cosine to 0. A plain script has no wall-budget planner, so this
one times its first steps and sets the schedule's length from them (as ``--time-budget`` does), stops at the
budget, then evaluates every test image once.

    python benchmarks/speedrun_timm.py --data ../shared/data/cifar10 --minutes 20 --seed 0
    python benchmarks/speedrun_timm.py --smoke --data DIR --minutes 0.1     # what speedrun.py --smoke runs

Prints one JSON line: ``top1, top5, best_top1, steps, epochs, images_per_sec, wall_s, rows``; ``python
benchmarks/speedrun.py --baseline timm`` runs it in a process of its own and reports it as a speedrun row.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import Stopwatch, speedrun_timm_model

PROBE_STEPS = 10
"""Steps timed (after two warm-up steps) to plan the schedule's length for the budget."""


def run(
    data: str | Path,
    *,
    minutes: float,
    seed: int,
    threads: int = 0,
    smoke: bool = False,
    batch: int = 128,
    workers: int = 2,
) -> dict:
    """Train for ``minutes`` of wall time and evaluate: ``{top1, top5, steps, epochs, images_per_sec, wall_s}``."""
    from torchvision import datasets, transforms

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    data = Path(data)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    size = 8 if smoke else 32
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(size, scale=(0.6, 1.0)),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )
    test_tf = transforms.Compose([transforms.Resize(size), transforms.ToTensor(), transforms.Normalize(mean, std)])
    train = datasets.ImageFolder(str(data / "train"), train_tf)
    test = datasets.ImageFolder(str(data / "test"), test_tf)
    batch = min(batch, len(train))
    tl = torch.utils.data.DataLoader(
        train, batch_size=batch, shuffle=True, drop_last=True, num_workers=workers, persistent_workers=workers > 0
    )
    el = torch.utils.data.DataLoader(test, batch_size=256, num_workers=workers)
    model = speedrun_timm_model(img=size, classes=len(train.classes), smoke=smoke)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    budget = minutes * 60
    clock = Stopwatch()
    total = None  # planned after the probe steps
    warm = max(1, round(0.3 * len(tl)))
    step = images = epochs = 0
    t_probe = None
    done = False
    while not done:
        model.train()
        epochs += 1
        for x, y in tl:
            if total is not None:
                s = step
                lr = s / warm if s < warm else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / (total - warm))))
            else:
                lr = step / warm
            for g in opt.param_groups:
                g["lr"] = 2e-3 * min(1.0, lr)
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            images += len(y)
            if step == 2:
                t_probe = clock.elapsed()
            elif step == 2 + PROBE_STEPS:
                per_step = (clock.elapsed() - t_probe) / PROBE_STEPS
                left = budget - clock.elapsed() - 10  # ~10 s kept for the evaluation
                total = max(step + 1, step + int(left / per_step), warm + 1)
            if clock.elapsed() >= budget - 10 or (total is not None and step >= total):
                done = True
                break
    train_s = clock.elapsed()
    model.eval()
    correct1 = correct5 = n = 0
    with torch.no_grad():
        for x, y in el:
            top = model(x).topk(min(5, len(train.classes)), dim=1).indices
            correct1 += (top[:, 0] == y).sum().item()
            correct5 += (top == y[:, None]).any(1).sum().item()
            n += len(y)
    top1, wall = correct1 / n, clock.elapsed()
    return {
        "top1": top1,
        "top5": correct5 / n,
        "best_top1": top1,  # one evaluation: the last is the best
        "steps": step,
        "epochs": epochs,
        "images_per_sec": images / train_s,
        "wall_s": wall,
        "rows": [{"top1": top1, "wall_s": wall}],  # as metrics.jsonl, for speedrun.minutes_to
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder with train/ and test/ (e.g. ../shared/data/cifar10)")
    p.add_argument("--minutes", type=float, default=20.0, help="wall budget (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default 0: torch's own)")
    p.add_argument("--smoke", action="store_true", help="8 px images and a tiny model: checks the pipeline only")
    args = p.parse_args(argv)
    print(json.dumps(run(args.data, minutes=args.minutes, seed=args.seed, threads=args.threads, smoke=args.smoke)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
