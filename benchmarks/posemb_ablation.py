"""Position-embedding ablation (paper Appendix D.4, Table 8), plus class token vs global average pooling.

Trains every variant with the same data, seed, recipe and number of optimizer steps, and writes a
markdown table (variant, parameters, test top-1) and the raw numbers as JSON next to it.

    python benchmarks/posemb_ablation.py --data ../shared/data/cifar10 --out docs/posemb_ablation.md
    python benchmarks/posemb_ablation.py --data digits --variants none,learn --steps 50 --patch-size 2

Fixed steps, not a time budget, by default: the variants then see exactly the same images in the
same order, so a slower variant is not penalised by a busy machine (``--budget 60s`` instead gives
each variant that much wall-clock time through ``vitlab train``'s ``--time-budget`` planner).
The step count is the nearest whole number of epochs (``fit`` evaluates at epoch ends).
``--train-per-class`` / ``--test-per-class`` take the first N files of each class of an
ImageFolder (as symlinks under ``--runs``, decoded into the cache once) to keep the run small.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from _common import Stopwatch

# name -> ViTConfig changes; Table 8 compares the first four (with the class token).
VARIANTS: dict[str, dict] = {
    "none": {"posemb": "none"},
    "learn": {"posemb": "learn"},
    "learn2d": {"posemb": "learn2d"},
    "sincos2d": {"posemb": "sincos2d"},
    "learn-gap": {"posemb": "learn", "pool": "gap", "class_token": False},
    "sincos2d-gap": {"posemb": "sincos2d", "pool": "gap", "class_token": False},
}
DESCRIPTIONS = {
    "none": "no position embedding (a bag of patches)",
    "learn": "learned 1-D (the paper's default)",
    "learn2d": "learned 2-D: row + column halves",
    "sincos2d": "fixed 2-D sine-cosine",
    "learn-gap": "learned 1-D, no class token, mean-pooled",
    "sincos2d-gap": "fixed 2-D sine-cosine, no class token, mean-pooled",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", default="../shared/data/cifar10", help="ImageFolder (train/ + test/ or val/) or digits")
    p.add_argument(
        "--out", default="docs/posemb_ablation.md", help="markdown table to write (the JSON goes next to it)"
    )
    p.add_argument("--runs", default="runs/posemb_ablation", help="folder for the runs and the data subset")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {', '.join(VARIANTS)}")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per variant (rounded to whole epochs)")
    p.add_argument(
        "--budget", default=None, metavar="DURATION", help="instead of --steps: wall-clock per variant, e.g. 60s"
    )
    p.add_argument("--train-per-class", type=int, default=2000, help="first N training images per class (0: all)")
    p.add_argument("--test-per-class", type=int, default=300, help="first N test images per class (0: all)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--patch-size", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads per run (1 leaves a core to the data worker)"
    )
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        p.error(f"--variants: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(VARIANTS)}")
    args.variants = names
    return args


def subset_folder(data: str, dest: Path, *, train_per_class: int, test_per_class: int) -> str:
    """``data`` itself, or a folder of symlinks to the first N files of each class of each split."""
    root = Path(data)
    if not root.is_dir() or (train_per_class <= 0 and test_per_class <= 0):
        return data
    for split in sorted(p.name for p in root.iterdir() if p.is_dir()):
        n = train_per_class if split == "train" else test_per_class
        for cls in sorted(c for c in (root / split).iterdir() if c.is_dir()):
            out = dest / split / cls.name
            out.mkdir(parents=True, exist_ok=True)
            files = sorted(f for f in cls.iterdir() if f.is_file())
            for f in files[:n] if n > 0 else files:
                link = out / f.name
                if not link.exists():
                    link.symlink_to(f.resolve())
    return str(dest)


def train_variant(name: str, data: str, n_train: int, args: argparse.Namespace) -> dict:
    """One ``fit`` with the shared recipe and this variant's architecture."""
    from _common import parse_duration

    from vitlab.train import TrainConfig, fit, get_recipe

    steps_per_epoch = n_train // args.batch_size
    if steps_per_epoch < 1:
        raise SystemExit(f"--batch-size {args.batch_size} is larger than the {n_train} training images")
    epochs = max(1, round(args.steps / steps_per_epoch))
    budget = parse_duration(args.budget) if args.budget else None
    # the small-data recipe without the regularisers that only pay off over ~100 epochs
    recipe = get_recipe(
        "small-data",
        epochs=10_000 if budget else epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=max(1, (args.steps if budget else epochs * steps_per_epoch) // 10),
        mixup=0.0,
        cutmix=0.0,
        random_erasing=0.0,
        drop_path=0.0,
        crop_scale=(0.6, 1.0),
    )
    recipe = dataclasses.replace(recipe, randaugment=None)
    arch = {"patch_size": args.patch_size, "embed_dim": args.dim, "depth": args.depth, "num_heads": args.heads}
    arch.update(mlp_ratio=args.mlp_ratio, **VARIANTS[name])
    cfg = TrainConfig(
        recipe=recipe,
        data=data,
        out=str(Path(args.runs) / name),
        arch=arch,
        seed=args.seed,
        threads=args.threads,
        cache_dir=args.cache_dir,
        time_budget=budget,
        keep="last",
        progress=not args.no_progress,
    )
    clock = Stopwatch()
    s = fit(cfg)
    return {
        "variant": name,
        "description": DESCRIPTIONS[name],
        **VARIANTS[name],
        "params": s["params"],
        "steps": s["steps"],
        "epochs": s["epochs"],
        "top1": s["top1"],
        "best_top1": s["best_top1"],
        "wall_s": clock.elapsed(),
        "load_1min": os.getloadavg()[0],
    }


def markdown(
    rows: list[dict], args: argparse.Namespace, load_before: tuple[float, float, float], n_train: int, n_test: int
) -> str:
    r0 = rows[0]
    mode = (
        f"a {args.budget} wall-clock budget per variant"
        if args.budget
        else f"{r0['steps']} optimizer steps per variant (fixed)"
    )
    lines = [
        f"Position-embedding ablation (paper Appendix D.4, Table 8) on `{args.data}`: {n_train:,} training / "
        f"{n_test:,} evaluation images, ViT patch {args.patch_size}, width {args.dim}, depth {args.depth}, "
        f"{args.heads} heads, MLP ratio {args.mlp_ratio:g}; small-data recipe (AdamW lr {args.lr:g}, "
        f"batch {args.batch_size}, 10% warmup + cosine, crop + flip, label smoothing 0.1), seed {args.seed}, "
        f"{mode}, {args.threads} torch thread(s).",
        f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; "
        "the last column is the 1-minute load after each run.",
        "",
        "| variant | position embedding / pooling | params | steps | test top-1 | wall (s) | load |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['description']} | {r['params']:,} | {r['steps']} | {100 * r['top1']:.2f}% | "
            f"{r['wall_s']:.0f} | {r['load_1min']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    data = subset_folder(
        args.data, runs / "data", train_per_class=args.train_per_class, test_per_class=args.test_per_class
    )
    from vitlab.data import load_data

    splits = load_data(data, cache_dir=args.cache_dir, progress=not args.no_progress)  # decodes into the cache once
    n_train, n_test = len(splits.train), len(splits.val)
    del splits
    load_before = os.getloadavg()
    rows = []
    for name in args.variants:
        print(f"== {name}: {DESCRIPTIONS[name]}", file=sys.stderr)
        rows.append(train_variant(name, data, n_train, args))
    table = markdown(rows, args, load_before, n_train, n_test)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    out.with_suffix(".json").write_text(
        json.dumps({"args": {k: v for k, v in vars(args).items()}, "rows": rows}, indent=2) + "\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
