"""Throughput of the training data pipeline for the small CIFAR configuration: the decode
cache (JPEGs decoded once into a uint8 array) plus the per-image torchvision.transforms.v2
augmentation and the per-batch MixUp/CutMix, as `vitlab train` composes them.

Compare its images/s with the training step's (`vitlab bench --mode train ...`): the
pipeline must sustain several times the step's rate so the model never waits.

    python benchmarks/bench_data.py --data /work/shared/data/cifar10 --batches 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader

from vitlab.bench import benchmark
from vitlab.data import ArrayDataset, load_data, mix_transform, train_transform
from vitlab.train.recipes import get_recipe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/work/shared/data/cifar10")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--train-steps", type=int, default=4, help="also time this many training steps of the CIFAR model (0: skip)"
    )
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}")
    t0 = time.perf_counter()
    splits = load_data(args.data, progress=True)
    print(
        f"decode cache: {len(splits.train)} train images ready in {time.perf_counter() - t0:.1f} s "
        "(includes decoding on a cold cache)"
    )
    img_size = splits.train.images.shape[1]
    r = get_recipe("small-data")  # the augmentation of `vitlab train --recipe small-data`
    tf = train_transform(
        img_size=img_size,
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
        crop_scale=r.crop_scale,
        crop_ratio=r.crop_ratio,
        hflip=r.hflip,
        randaugment=r.randaugment,
        random_erasing=r.random_erasing,
    )
    mix = mix_transform(num_classes=splits.num_classes, mixup=r.mixup, cutmix=r.cutmix)
    rates = {}
    ds = ArrayDataset(splits.train.images, splits.train.labels, transform=tf)
    for workers in args.workers:
        torch.manual_seed(0)
        loader = DataLoader(
            ds,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=workers,
            drop_last=True,
            persistent_workers=workers > 0,
        )
        it = iter(loader)
        next(it)  # start the workers
        ts = []
        for _ in range(args.batches):
            t = time.perf_counter()
            x, y = next(it)
            if mix is not None:
                x, y = mix(x, y)
            ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        rates[workers] = args.batch_size / med
        print(
            f"workers={workers}: {rates[workers]:8.0f} img/s "
            f"(median of {args.batches} batches of {args.batch_size}, recipe small-data augmentation)"
        )
    if args.train_steps:
        kw = dict(img_size=32, patch_size=4, embed_dim=192, depth=9, num_heads=3, mlp_dim=384)
        t = benchmark(
            "vit_ti16",
            mode="train",
            batch_size=args.batch_size,
            num_classes=10,
            steps=args.train_steps,
            warmup=1,
            measure_peak=False,
            **kw,
        )
        print(f"training step (same process, just after): {t.images_per_sec:.0f} img/s")
        for w, v in rates.items():
            print(f"data pipeline / training step, workers={w}: {v / t.images_per_sec:.1f}x")
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
