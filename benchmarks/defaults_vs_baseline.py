"""The default ``vitlab train --data DIR --epochs N`` against a plain timm ViT of the same size trained by a
minimal script (AdamW, warmup + cosine, horizontal flip, label smoothing 0.1), in the same process, on a
class-balanced subset of an ImageFolder (CIFAR-10 JPEGs by default). Prints one JSON line per seed and a
Markdown table row; results go in docs/training.md with the command.

    python benchmarks/defaults_vs_baseline.py --data ../shared/data/cifar10 --per-class 200 --epochs 5
    python benchmarks/defaults_vs_baseline.py --per-class 1000 --grayscale --img-size 28 --epochs 5   # 10k, gray 28 px

The baseline is what a careful user of timm writes in 40 lines: ``timm.models.VisionTransformer`` with the
architecture the default run chose (patch, width, depth, heads, MLP width), AdamW LR 1e-3 weight decay 0.05 at
batch 128, 5% linear warmup then cosine to 0, flip, label smoothing 0.1, ``--epochs`` passes over the same
images, evaluated on the same test subset. It sees the same number of epochs, not the same number of steps.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image


def make_subset(
    src: Path,
    dst: Path,
    *,
    per_class: int,
    test_per_class: int,
    gray: bool,
    size: int | None,
    holdout: bool = False,
) -> Path:
    """``dst/{train,test}/<class>/`` with the first ``per_class`` / ``test_per_class`` images of each class,
    optionally grayscale and resized to ``size``. ``holdout``: the "test" images are the ``test_per_class``
    training images after the first ``per_class``, so that a recipe can be chosen without the test split."""
    for split, n in (("train", per_class), ("test", test_per_class)):
        src_split, skip = ("train", per_class) if holdout and split == "test" else (split, 0)
        for cdir in sorted(p for p in (src / src_split).iterdir() if p.is_dir()):
            out = dst / split / cdir.name
            out.mkdir(parents=True, exist_ok=True)
            for f in sorted(cdir.iterdir())[skip : skip + n]:
                if not gray and size is None:
                    shutil.copyfile(f, out / f.name)
                    continue
                im = Image.open(f).convert("L" if gray else "RGB")
                if size is not None:
                    im = im.resize((size, size), Image.BICUBIC)
                im.save(out / (f.stem + ".png"))
    return dst


def run_default(
    data: Path,
    out: Path,
    *,
    epochs: int,
    seed: int,
    cache: Path,
    recipe: str | None = None,
    extra: tuple[str, ...] = (),
) -> dict:
    from vitlab.cli import main

    args = ["train", "--data", str(data), "--epochs", str(epochs), "--seed", str(seed), "--out", str(out)]
    args += ["--recipe", recipe] if recipe else []
    args += list(extra)
    t0 = time.perf_counter()
    code = main([*args, "--overwrite", "--no-progress", "--cache-dir", str(cache)])
    assert code == 0, code
    s = json.loads((out / "summary.json").read_text())
    s["bench_wall_s"] = time.perf_counter() - t0
    return s


def run_baseline(data: Path, *, arch: dict, img: int, in_chans: int, epochs: int, seed: int, batch: int) -> dict:
    """The plain timm script."""
    import timm
    from torchvision import datasets, transforms

    torch.manual_seed(seed)
    mean, std = [0.5] * in_chans, [0.5] * in_chans
    gray = [transforms.Grayscale(1)] if in_chans == 1 else []
    train_tf = transforms.Compose(
        [*gray, transforms.RandomHorizontalFlip(), transforms.ToTensor(), transforms.Normalize(mean, std)]
    )
    test_tf = transforms.Compose([*gray, transforms.ToTensor(), transforms.Normalize(mean, std)])
    train = datasets.ImageFolder(str(data / "train"), train_tf)
    test = datasets.ImageFolder(str(data / "test"), test_tf)
    tl = torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, drop_last=True)
    el = torch.utils.data.DataLoader(test, batch_size=256)
    model = timm.models.VisionTransformer(
        img_size=img,
        patch_size=arch["patch_size"],
        in_chans=in_chans,
        num_classes=len(train.classes),
        embed_dim=arch["embed_dim"],
        depth=arch["depth"],
        num_heads=arch["num_heads"],
        mlp_ratio=arch["mlp_dim"] / arch["embed_dim"],
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    total = epochs * len(tl)
    warm = max(1, round(0.05 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))
    )
    t0 = time.perf_counter()
    for _ in range(epochs):
        model.train()
        for x, y in tl:
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    correct = n = 0
    with torch.no_grad():
        for x, y in el:
            correct += (model(x).argmax(1) == y).sum().item()
            n += len(y)
    return {"top1": correct / n, "steps": total, "wall_s": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="../shared/data/cifar10")
    p.add_argument("--per-class", type=int, default=200)
    p.add_argument("--test-per-class", type=int, default=100)
    p.add_argument("--gray", "--grayscale", dest="gray", action="store_true", help="convert to grayscale (luma)")
    p.add_argument("--size", "--img-size", dest="size", type=int, default=None, help="resize the images to SIZE px")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--baseline-batch", type=int, default=128)
    p.add_argument(
        "--recipe", default=None, help="a named recipe instead of the default (e.g. small-data, the old one)"
    )
    p.add_argument(
        "--holdout",
        action="store_true",
        help="evaluate on training images left out of the subset, not on the test split (to choose a recipe)",
    )
    p.add_argument("--train-args", default="", help="extra `vitlab train` flags for the default side, e.g. '--lr 3e-3'")
    p.add_argument("--no-baseline", action="store_true", help="run only the default side")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = make_subset(
            Path(a.data),
            tmp / "data",
            per_class=a.per_class,
            test_per_class=a.test_per_class,
            gray=a.gray,
            size=a.size,
            holdout=a.holdout,
        )
        for seed in a.seeds:
            ours = run_default(
                data,
                tmp / f"run{seed}",
                epochs=a.epochs,
                seed=seed,
                cache=tmp / "cache",
                recipe=a.recipe,
                extra=tuple(shlex.split(a.train_args)),
            )
            m = ours["model"]
            arch = {k: m[k] for k in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_dim")}
            img = m["img_size"][0] if isinstance(m["img_size"], list) else m["img_size"]
            threads = torch.get_num_threads()
            theirs = {"top1": None, "steps": None, "wall_s": None}  # --no-baseline: null in the JSON line
            if not a.no_baseline:
                theirs = run_baseline(
                    data,
                    arch=arch,
                    img=img,
                    in_chans=ours["data"]["channels"],
                    epochs=a.epochs,
                    seed=seed,
                    batch=a.baseline_batch,
                )
            row = {
                "data": f"{a.per_class * 10} train / {a.test_per_class * 10} test, {'gray' if a.gray else 'colour'} "
                f"{a.size or 'native'} px" + (", held-out train images" if a.holdout else ""),
                "epochs": a.epochs,
                "seed": seed,
                "ours_top1": ours["top1"],
                "ours_steps": ours["steps"],
                "ours_wall_s": round(ours["wall_s"], 1),
                "ours_recipe": ours["recipe_chosen"],
                "baseline_top1": theirs["top1"],
                "baseline_steps": theirs["steps"],
                "baseline_wall_s": theirs["wall_s"] and round(theirs["wall_s"], 1),
                "arch": arch,
                "threads": threads,
                "train_args": a.train_args,
            }
            print(json.dumps(row))
            base, diff = "-", "-"
            if theirs["top1"] is not None:
                base = f"{100 * theirs['top1']:.1f}% ({theirs['steps']} steps)"
                diff = f"{100 * (ours['top1'] - theirs['top1']):+.1f}"
            print(
                f"| {row['data']} | {a.epochs} | {seed} | {100 * ours['top1']:.1f}% ({ours['steps']} steps) | "
                f"{base} | {diff} |"
            )


if __name__ == "__main__":
    main()
