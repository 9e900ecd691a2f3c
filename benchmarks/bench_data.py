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

from vitlab.data import ArrayDataset, load_data, mix_transform, train_transform


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/work/shared/data/cifar10")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--train-steps", type=int, default=4, help="also time this many training steps of the CIFAR model (0: skip)")
    args = ap.parse_args()
    print(f"# load average at start: {os.getloadavg()}")
    t0 = time.perf_counter()
    splits = load_data(args.data, progress=True)
    print(f"decode cache: {len(splits.train)} train images ready in {time.perf_counter() - t0:.1f} s (includes decoding on a cold cache)")
    img_size = splits.train.images.shape[1]
    tf = train_transform(
        img_size=img_size, mean=(0.5,) * 3, std=(0.5,) * 3, crop_scale=(0.6, 1.0), randaugment=tuple(args.randaugment), random_erasing=0.25
    )
    mix = mix_transform(num_classes=splits.num_classes, mixup=0.8, cutmix=1.0)
    ds = ArrayDataset(splits.train.images, splits.train.labels, transform=tf)
    for workers in args.workers:
        torch.manual_seed(0)
        loader = DataLoader(
            ds, batch_size=args.batch_size, shuffle=True, num_workers=workers, drop_last=True, persistent_workers=workers > 0
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
        print(
            f"workers={workers}: {args.batch_size / med:8.0f} img/s (median of {args.batches} batches of {args.batch_size}; RandAugment{tuple(args.randaugment)}, erasing, mixup/cutmix)"
        )
    print(f"# load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
