"""Packed training at native aspect ratio (NaViT: Dehghani et al. 2023, ``vitlab train --pack``) against square
training (the shorter side resized, a square crop) at equal wall-clock time, on photos of mixed shapes.

Each arm is one ``vitlab train`` run per seed with the same model, data, seed and ``--time-budget``; ``pack`` adds
``--pack --pack-res LOW,HIGH`` (each image's token budget drawn per image). The table reports, per arm and seed:
the optimizer steps the budget allowed, images and tokens a second (the run's own count: the last epoch's
images a second, times its mean tokens an image for the packed arm), the padding of the packed sequences, the
run's evaluation (centre crop; and at native aspect ratio for the packed arm), and every run's final model evaluated
at native aspect ratio at several resolutions (``--eval-res``: the NaViT claim that one model serves many
resolutions; :func:`vitlab.evaluate.evaluate_native`), on the folder's evaluation split (``validation/``).

    python benchmarks/pack_vs_square.py --data ../shared/data/clothing --budget 10m --seeds 0,1
    python benchmarks/pack_vs_square.py --data ../shared/data/clothing --budget 2m --seeds 0 --arms pack

Runs go under ``--runs`` (one folder per arm and seed); the markdown table goes to ``--out`` and the raw numbers as
JSON next to it. The arms run one after the other in this process: time them on an otherwise idle machine. With
``--budget``, a one-step run of each arm first fills its decode cache (the arms store the photos differently), so
that no arm's budget pays for decoding. ``--epochs N`` instead of ``--budget`` gives every run N epochs and skips
that (a quick check that everything runs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from _common import Stopwatch

ARMS = ("square", "pack")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", default="../shared/data/clothing", help="ImageFolder: train/ and validation/ (or val/)")
    p.add_argument("--out", default="runs/pack_vs_square/table.md", help="markdown table (the JSON goes next to it)")
    p.add_argument("--runs", default="runs/pack_vs_square", help="folder for the runs")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (one run per arm and seed)")
    p.add_argument("--budget", default="10m", metavar="DURATION", help="wall-clock time per run (--time-budget)")
    p.add_argument("--epochs", type=int, default=None, help="instead of --budget: this many epochs per run")
    p.add_argument("--img-size", type=int, default=64, help="the square arm's side; the packed arm's default budget")
    p.add_argument("--pack-res", default="48,96", metavar="LOW,HIGH", help="the packed arm's --pack-res")
    p.add_argument("--eval-res", default="48,64,96", help="native-aspect evaluation sides, comma-separated")
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=None, help="default: the auto recipe's")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per run (0: vitlab's default)")
    p.add_argument("--workers", type=int, default=-1, help="DataLoader workers per run (-1: vitlab's default)")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.command = " ".join(sys.argv[1:] if argv is None else argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not args.arms or any(a not in ARMS for a in args.arms):
        p.error(f"--arms: choose among {', '.join(ARMS)}")
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.eval_res = [float(s) for s in args.eval_res.split(",") if s.strip()]
    return args


def train_argv(arm: str, seed: int, args: argparse.Namespace, *, warm: bool = False) -> list[str]:
    """``vitlab train``'s arguments for one run (``warm``: the one step that fills the arm's decode cache)."""
    out = Path(args.runs) / (f"warm-{arm}" if warm else f"{arm}-s{seed}")
    argv = ["train", "--data", args.data, "--out", str(out), "--overwrite"]
    argv += ["--seed", str(seed), "--img-size", str(args.img_size), "--patch-size", str(args.patch_size)]
    argv += ["--dim", str(args.dim), "--depth", str(args.depth), "--heads", str(args.heads), "--keep", "last"]
    argv += ["--threads", str(args.threads), "--workers", str(args.workers)]
    if warm:
        argv += ["--epochs", "1", "--stop-after", "1"]
    else:
        argv += ["--epochs", str(args.epochs)] if args.epochs else ["--time-budget", args.budget]
    argv += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    argv += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    argv += ["--no-progress"] if args.no_progress else []
    return argv + (["--pack", "--pack-res", args.pack_res] if arm == "pack" else [])


class EvalSplit:
    """The folder's evaluation split as decoded images at their own aspect ratio (the shorter side at most
    ``side`` px) and labels in the order of ``class_names``: what :func:`vitlab.evaluate.evaluate_native` reads."""

    def __init__(self, root: Path, class_names: list[str], *, side: int) -> None:
        from PIL import Image

        split = next((root / n for n in ("val", "valid", "validation", "test") if (root / n).is_dir()), None)
        if split is None:
            raise SystemExit(f"--data {root}: no val/, validation/ or test/ folder")
        self.images: list[np.ndarray] = []
        labels = []
        for label, name in enumerate(class_names):
            for f in sorted((split / name).iterdir()) if (split / name).is_dir() else []:
                if f.suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                with Image.open(f) as im:
                    im = im.convert("RGB")
                    scale = side / min(im.size)
                    if scale < 1:
                        im = im.resize((round(im.width * scale), round(im.height * scale)), Image.BICUBIC)
                    self.images.append(np.asarray(im))
                labels.append(label)
        self.labels = np.asarray(labels, dtype=np.int64)


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One training run and its row: the run's own numbers and its model at each ``--eval-res``."""
    from vitlab.cli import main as vitlab

    clock = Stopwatch()
    if vitlab(train_argv(arm, seed, args)) != 0:
        raise SystemExit(f"the {arm} run of seed {seed} failed (its error is above)")
    wall = clock.elapsed()
    out = Path(args.runs) / f"{arm}-s{seed}"
    summary = json.loads((out / "summary.json").read_text())
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    row = {
        "arm": arm,
        "seed": seed,
        "steps": summary["steps"],
        "epochs": summary["epochs"],
        "images_per_sec": last["images_per_sec"],
        "tokens_per_sec": last.get("tokens_per_sec"),
        "padding": last.get("padding"),
        "top1": last["top1"],
        "top1_native": last.get("top1_native"),
        "wall_s": wall,
        "load_1min": os.getloadavg()[0],
    }
    row["native_at"] = native_at(out, args)
    return row


def native_at(out: Path, args: argparse.Namespace) -> dict[str, float]:
    """The run's exported model (``model/``, the last epoch's with ``--keep last``) at native aspect ratio at each
    ``--eval-res`` side."""
    from vitlab.checkpoints import load
    from vitlab.evaluate import evaluate_native

    model = load(out / "model")  # the plain model (no speed paths), in eval mode
    cfg = model.config
    split = EvalSplit(Path(args.data), list(cfg.class_names), side=int(2 * max(args.eval_res)))
    return {f"{r:g}": evaluate_native(model, split, resolution=r)["top1"] for r in args.eval_res}


def markdown(rows: list[dict], args: argparse.Namespace, load_before: tuple[float, float, float]) -> str:
    mode = f"{args.epochs} epoch(s) per run" if args.epochs else f"a {args.budget} wall-clock budget per run"
    res = [f"{r:g}" for r in args.eval_res]
    lines = [
        f"Packed (NaViT, `--pack --pack-res {args.pack_res}`) vs square (`--img-size {args.img_size}`) training on "
        f"`{args.data}`: ViT patch {args.patch_size}, width {args.dim}, depth {args.depth}, {args.heads} heads, "
        f"the auto recipe, {mode}, {args.threads or 'default'} torch thread(s).",
        f"Command: `python benchmarks/pack_vs_square.py {args.command}`",
        f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; "
        "the last column is the 1-minute load after each run.",
        "",
        "| arm | seed | steps | img/s | tokens/s | padding | top-1 (crop) | top-1 (native) | "
        + " | ".join(f"native @{r} px" for r in res)
        + " | wall (s) | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(res) + "---:|---:|",
    ]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}%"

    for r in rows:
        tps = "-" if r["tokens_per_sec"] is None else f"{r['tokens_per_sec']:.0f}"
        pad = "-" if r["padding"] is None else f"{100 * r['padding']:.1f}%"
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['images_per_sec']:.1f} | {tps} | "
            f"{pad} | {pct(r['top1'])} | "
            f"{pct(r['top1_native'])} | " + " | ".join(pct(r["native_at"][k]) for k in res) + " | "
            f"{r['wall_s']:.0f} | {r['load_1min']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    if not args.epochs:
        from vitlab.cli import main as vitlab

        for arm in args.arms:
            print(f"== {arm}: filling the decode cache (one step, untimed)", file=sys.stderr)
            if vitlab(train_argv(arm, args.seeds[0], args, warm=True)) != 0:
                raise SystemExit(f"the {arm} arm's first step failed (its error is above)")
    load_before = os.getloadavg()
    rows = []
    for seed in args.seeds:
        for arm in args.arms:
            print(f"== {arm}, seed {seed}", file=sys.stderr)
            rows.append(run_arm(arm, seed, args))
    table = markdown(rows, args, load_before)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
