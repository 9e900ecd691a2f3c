"""Throughput of the training data pipelines.

1. The small CIFAR configuration: the decode cache (JPEGs decoded once into a uint8 array) plus the per-image
   torchvision.transforms.v2 augmentation and the per-batch MixUp/CutMix, as `vitlab train` composes them. Compare
   its images/s with the training step's (`vitlab bench --mode train ...`): the pipeline must sustain several times
   the step's rate so the model never waits.
2. Decoding full-size JPEGs on the fly (the shard reader's job, `--data SHARDS`): decode + RandomResizedCrop(224)
   + horizontal flip (+ normalisation), images/s on one core (one thread, one process), on the same files in one
   run: vitlab's reader path (the one decoder, PIL, the crop drawn on the original and the JPEG decoded at the
   smallest DCT scale that keeps the crop >= 224 px: `vitlab.data.shards.stream.TrainDecode`), the same decoder at full
   scale followed by torchvision's RandomResizedCrop, torchvision.io.decode_jpeg (libjpeg-turbo) followed by it, and
   timm's own loader (`timm.data.ImageDataset` + `timm.data.create_transform(224, is_training=True)`, its colour
   jitter off, bilinear).

    python benchmarks/bench_data.py --data /work/shared/data/cifar10 --batches 20      # both
    python benchmarks/bench_data.py --skip-pipeline --jpeg-size 4032x3024 --n-jpegs 32  # the decode rows only
    python benchmarks/bench_data.py --smoke                                             # seconds, tiny JPEGs
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import CIFAR_TRAIN_STEP, Stopwatch, TrainDecode, decode_encoded, photo_pixels
from torch.utils.data import DataLoader

from vitlab.bench import benchmark, time_calls
from vitlab.data import ArrayDataset, load_data, mix_transform, train_transform
from vitlab.train import get_recipe

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def write_jpegs(folder: Path, *, n: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    """``n`` photo-like JPEGs (quality 90) of ``size`` (width, height) in ``folder/photos/``: smooth colour fields
    upsampled from a coarse grid plus fine noise (noise alone would compress, and decode, unlike a photo)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (folder / "photos").mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        p = folder / "photos" / f"{i:04d}.jpg"
        Image.fromarray(photo_pixels(rng, size)).save(p, "JPEG", quality=90)
        paths.append(p)
    return paths


def decode_paths(paths: list[Path], root: Path, img_size: int) -> dict[str, object]:
    """name -> a callable ``i -> normalised CHW tensor`` of the ``i``-th file, for each of the compared paths."""
    import timm.data
    import torchvision
    from torchvision.transforms import v2

    rest = train_transform(img_size=img_size, mean=MEAN, std=STD, crop=False)
    crop = train_transform(img_size=img_size, mean=MEAN, std=STD)  # RandomResizedCrop + flip + normalise
    assert isinstance(crop.transforms[0], v2.RandomResizedCrop)
    reader = TrainDecode(img_size=img_size, crop_scale=(0.08, 1.0), crop_ratio=(3 / 4, 4 / 3), in_chans=3, rest=rest)
    timm_tf = timm.data.create_transform(img_size, is_training=True, color_jitter=None, interpolation="bilinear")
    timm_ds = timm.data.ImageDataset(str(root), transform=timm_tf)  # timm's own reader of the same files
    assert len(timm_ds) == len(paths), (len(timm_ds), len(paths))

    def full(i: int) -> torch.Tensor:
        return crop(torch.from_numpy(np.array(decode_encoded(paths[i].read_bytes()))).permute(2, 0, 1))

    def tv(i: int) -> torch.Tensor:
        data = torch.frombuffer(bytearray(paths[i].read_bytes()), dtype=torch.uint8)
        return crop(torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB))

    return {
        "vitlab reader (PIL, crop-aware draft)": lambda i: reader(paths[i].read_bytes()),
        "vitlab decoder at full scale + v2 RandomResizedCrop": full,
        "torchvision.io.decode_jpeg + v2 RandomResizedCrop": tv,
        "timm (ImageDataset + create_transform)": lambda i: timm_ds[i][0],
    }


def decode_rows(paths: list[Path], root: Path, *, img_size: int, repeats: int) -> list[dict[str, object]]:
    """Images/s on one core of each path over ``paths``, the median of ``repeats`` passes, after one warm-up pass
    (the files are then in the page cache: decoding, not the disk, is measured). The paths take turns each pass."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fns = decode_paths(paths, root, img_size)

        def decode_all(name: str, fn):
            def run() -> None:
                for i in range(len(paths)):
                    x = fn(i)
                    assert x.shape[-2:] == (img_size, img_size), (name, x.shape)

            return run

        calls = {name: decode_all(name, fn) for name, fn in fns.items()}
        # each pass seeds torch with its number before each path (outside the timing): the same crops for all
        times = time_calls(calls, rounds=repeats, warmup=1, alternate=False, setup=lambda _, r: torch.manual_seed(r))
    finally:
        torch.set_num_threads(threads)
    return [{"path": name, "img_per_s_per_core": len(paths) / t.median} for name, t in times.items()]


def run_decode(args: argparse.Namespace) -> None:
    w, h = (int(v) for v in args.jpeg_size.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.jpegs) if args.jpegs else Path(tmp)
        if args.jpegs:
            paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
        else:
            paths = write_jpegs(root, n=args.n_jpegs, size=(w, h))
        mb = sum(p.stat().st_size for p in paths) / len(paths) / 1e6
        where = (
            f"{len(paths)} {'files of ' + args.jpegs if args.jpegs else f'generated {w}x{h} JPEGs'}, {mb:.2f} MB each"
        )
        rows = decode_rows(paths, root, img_size=args.img_size, repeats=args.repeats)
    print(f"decode + RandomResizedCrop({args.img_size}) + flip, one core ({where}):")
    for r in rows:
        print(f"  {r['path']:<55} {r['img_per_s_per_core']:8.1f} img/s")
    timm_rate = rows[-1]["img_per_s_per_core"]
    best = max(rows[:3], key=lambda r: r["img_per_s_per_core"])
    print(f"fastest vitlab-side path: {best['path']}, {best['img_per_s_per_core'] / timm_rate:.2f}x timm's loader")
    print(json.dumps({"decode_rows": rows, "img_size": args.img_size, "files": where}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/work/shared/data/cifar10")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--train-steps", type=int, default=4, help="also time this many training steps of the CIFAR model (0: skip)"
    )
    g = ap.add_argument_group("decoding full-size JPEGs")
    g.add_argument("--jpegs", default=None, help="a folder of JPEGs (default: generate --n-jpegs of --jpeg-size)")
    g.add_argument("--jpeg-size", default="4032x3024", help="generated JPEGs' WIDTHxHEIGHT (a phone photo)")
    g.add_argument("--n-jpegs", type=int, default=32)
    g.add_argument("--img-size", type=int, default=224)
    g.add_argument("--repeats", type=int, default=3, help="timed passes over the files (median)")
    ap.add_argument("--skip-pipeline", action="store_true", help="only the decode rows")
    ap.add_argument("--skip-decode", action="store_true", help="only the CIFAR pipeline rows")
    ap.add_argument("--smoke", action="store_true", help="the decode rows on 4 tiny generated JPEGs, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.skip_pipeline, args.skip_decode, args.jpegs = True, False, None
        args.jpeg_size, args.n_jpegs, args.img_size, args.repeats = "160x120", 4, 32, 1
    print(f"# load average at start: {os.getloadavg()}")
    if not args.skip_decode:
        run_decode(args)
    if not args.skip_pipeline:
        run_pipeline(args)
    print(f"# load average at end: {os.getloadavg()}")


def run_pipeline(args: argparse.Namespace) -> None:
    clock = Stopwatch()
    splits = load_data(args.data, progress=True)
    print(
        f"decode cache: {len(splits.train)} train images ready in {clock.elapsed():.1f} s "
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

        def batch(it=it) -> None:
            x, y = next(it)
            if mix is not None:
                x, y = mix(x, y)

        med = time_calls({"batch": batch}, rounds=args.batches)["batch"].median
        rates[workers] = args.batch_size / med
        print(
            f"workers={workers}: {rates[workers]:8.0f} img/s "
            f"(median of {args.batches} batches of {args.batch_size}, recipe small-data augmentation)"
        )
    if args.train_steps:
        kw = {**CIFAR_TRAIN_STEP, "batch_size": args.batch_size}  # the small CIFAR model's training step
        t = benchmark(kw.pop("model"), steps=args.train_steps, warmup=1, measure_peak=False, **kw)
        print(f"training step (same process, just after): {t.images_per_sec:.0f} img/s")
        for w, v in rates.items():
            print(f"data pipeline / training step, workers={w}: {v / t.images_per_sec:.1f}x")


if __name__ == "__main__":
    main()
