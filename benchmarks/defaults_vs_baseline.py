"""The default ``vitlab train --data DIR --epochs N`` against a plain timm ViT of the same size trained by a
minimal script (AdamW, warmup + cosine, horizontal flip, label smoothing 0.1), in the same process, on a
class-balanced subset of an ImageFolder (CIFAR-10 JPEGs by default). Prints one JSON line per seed and a
Markdown table row; results go in docs/training.md with the command.

    python benchmarks/defaults_vs_baseline.py --data ../shared/data/cifar10 --per-class 200 --epochs 5
    python benchmarks/defaults_vs_baseline.py --per-class 1000 --grayscale --img-size 28 --epochs 5   # 10k, gray 28 px

Photo rows (issue 34): ``--photos`` reads a folder of real photos with ``train/``, ``validation/`` and ``test/``
(``../shared/data/clothing``), evaluates both sides on ``--split`` (``validation`` to choose, ``test`` to report),
gives vitlab the photos as they are, and the baseline the same photos pre-resized once (outside its clock) to the
size the default run trained at. With ``--time-budget`` both sides get the same seconds: vitlab its flag, the
baseline a plan from its own first steps' pace (warmup + cosine over the steps that fit, stopped at the budget).
``--photo-rows`` runs the issue's grid: budgets of 2, 5 and 10 minutes at the default size and at 64 px, and 30
epochs, each for every ``--seeds``::

    python benchmarks/defaults_vs_baseline.py --photos --data ../shared/data/clothing --time-budget 300 --seeds 0 1
    python benchmarks/defaults_vs_baseline.py --photos --data ../shared/data/clothing --photo-rows --split test

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
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import Stopwatch, make_photo_folder
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
    epochs: int | None,
    seed: int,
    cache: Path,
    recipe: str | None = None,
    extra: tuple[str, ...] = (),
) -> dict:
    from vitlab.cli import main

    args = ["train", "--data", str(data), "--seed", str(seed), "--out", str(out)]
    args += ["--epochs", str(epochs)] if epochs is not None else []  # None: ``extra`` says how long
    args += ["--recipe", recipe] if recipe else []
    args += list(extra)
    clock = Stopwatch()
    code = main([*args, "--overwrite", "--no-progress", "--cache-dir", str(cache)])
    assert code == 0, code
    s = json.loads((out / "summary.json").read_text())
    s["bench_wall_s"] = clock.elapsed()
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
    clock = Stopwatch()
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
    return {"top1": correct / n, "steps": total, "wall_s": clock.elapsed()}


def _photo_tensors(folder: Path, *, short: int, crop: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(images uint8 (N, 3, crop, crop), labels, classes)``: every photo of an ImageFolder decoded once, its
    shorter side resized to ``short`` (bicubic) and centre-cropped to ``crop``: the baseline's pre-resized copy."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    xs, ys = [], []
    for label, name in enumerate(classes):
        for f in sorted((folder / name).iterdir()):
            with Image.open(f) as im:
                im = im.convert("RGB")
                w, h = im.size
                scale = short / min(w, h)
                im = im.resize((max(crop, round(w * scale)), max(crop, round(h * scale))), Image.BICUBIC)
                left, top = (im.size[0] - crop) // 2, (im.size[1] - crop) // 2
                im = im.crop((left, top, left + crop, top + crop))
            xs.append(torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(crop, crop, 3).permute(2, 0, 1))
            ys.append(label)
    return torch.stack(xs), torch.tensor(ys), classes


def run_photo_baseline(
    data: Path, *, arch: dict, img: int, epochs: int | None, budget: float | None, seed: int, batch: int
) -> dict:
    """The plain timm script on photos: the images pre-resized once (train: shorter side 1.15x the size, for the
    crops; evaluation: shorter side ``img / 0.875`` and a centre crop, timm's ``crop_pct``), random resized crops
    (0.35-1) and flips, ImageNet normalisation, AdamW 1e-3 wd 0.05, 5% warmup + cosine, label smoothing 0.1.
    ``budget``: seconds of training and evaluation, the plan fitted to the pace of its own first steps.
    Returns ``top1``, ``steps``, ``wall_s`` (training and evaluation, not the pre-resizing), and ``train_s`` and
    ``images`` (the training steps alone and the images they took: a throughput without the evaluation)."""
    import timm

    torch.manual_seed(seed)
    train_x, train_y, classes = _photo_tensors(data / "train", short=round(img * 1.15), crop=round(img * 1.15))
    test_x, test_y, _ = _photo_tensors(data / "val", short=round(img / 0.875), crop=img)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    from torchvision.transforms import v2

    augment = v2.Compose([v2.RandomResizedCrop(img, scale=(0.35, 1.0), antialias=True), v2.RandomHorizontalFlip()])
    model = timm.models.VisionTransformer(
        img_size=img, patch_size=arch["patch_size"], num_classes=len(classes), embed_dim=arch["embed_dim"],
        depth=arch["depth"], num_heads=arch["num_heads"], mlp_ratio=arch["mlp_dim"] / arch["embed_dim"],
        dynamic_img_pad=img % arch["patch_size"] != 0,
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    batch = min(batch, len(train_x))  # a tiny folder (a smoke run): one batch of everything
    per_epoch = len(train_x) // batch
    plan = {"total": epochs * per_epoch if epochs else 10**9}  # a budget: re-planned at step 15

    def factor(s: int) -> float:
        warm = max(1, round(0.05 * plan["total"]))
        return (
            (s + 1) / warm
            if s < warm
            else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, plan["total"] - warm))))
        )

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    clock, step, timed = Stopwatch(), 0, 0.0
    deadline = budget * 0.97 if budget else math.inf  # seconds on the clock; 3%: the final evaluation
    while step < plan["total"] and clock.elapsed() < deadline:
        model.train()
        order = torch.randperm(len(train_x))
        for i in range(per_epoch):
            idx = order[i * batch : (i + 1) * batch]
            x = torch.stack([augment(im) for im in train_x[idx]]).float().div_(255).sub_(mean).div_(std)
            loss = F.cross_entropy(model(x), train_y[idx], label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if budget and step == 5:
                timed = clock.elapsed()
            if budget and step == 15:  # plan from the pace of steps 5-15, as a user timing an epoch would
                pace = (clock.elapsed() - timed) / 10
                plan["total"] = step + max(1, int((deadline - clock.elapsed()) / pace))
            if step >= plan["total"] or clock.elapsed() >= deadline:
                break
    train_s = clock.elapsed()  # the training steps alone (benchmarks/busy_machine.py: their img/s)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(test_x), 256):
            x = test_x[i : i + 256].float().div_(255).sub_(mean).div_(std)
            correct += (model(x).argmax(1) == test_y[i : i + 256]).sum().item()
    return {
        "top1": correct / len(test_x), "steps": step, "wall_s": clock.elapsed(),
        "train_s": train_s, "images": step * batch,
    }  # fmt: skip


def photo_baseline_child(spec_path: Path) -> None:
    """``--photo-baseline SPEC``: :func:`run_photo_baseline` alone on the JSON spec's data (``data``, ``arch``, ``img``,
    ``epochs``, ``seed``, ``batch``) with torch's default threads (a plain script sets none), its result and those
    threads written to the spec's ``result``: the timm script's process of ``benchmarks/busy_machine.py``."""
    spec = json.loads(spec_path.read_text())
    threads = torch.get_num_threads()  # a plain script's: never set
    r = run_photo_baseline(Path(spec["data"]), arch=spec["arch"], img=spec["img"], epochs=spec["epochs"],
                           budget=None, seed=spec["seed"], batch=spec["batch"])  # fmt: skip
    Path(spec["result"]).write_text(json.dumps({**r, "threads": threads}))


PHOTO_ROWS = [("--time-budget", m * 60, size) for m in (2, 5, 10) for size in (None, 64)] + [("--epochs", 30, None)]
"""The issue's photo rows: ``(flag, value, --img-size)``; None: the default size."""


def photo_rows(a: argparse.Namespace, tmp: Path) -> None:
    """One JSON line and one Markdown row per photo configuration (``--photo-rows``: :data:`PHOTO_ROWS`, else the
    one ``--time-budget`` / ``--epochs`` / ``--img-size`` given) and seed."""
    data = make_photo_folder(Path(a.data), tmp / "photos", split=a.split)
    threads = torch.get_num_threads()  # a plain script's: vitlab sets its own in-process, the baseline gets these
    if a.photo_rows:
        rows = PHOTO_ROWS
    elif a.time_budget:
        rows = [("--time-budget", a.time_budget, a.size)]
    else:
        rows = [("--epochs", a.epochs, a.size)]
    for flag, value, size in rows:
        for seed in a.seeds:
            budget = value if flag == "--time-budget" else None
            extra = [flag, str(value)] + (["--img-size", str(size)] if size else []) + shlex.split(a.train_args)
            ours = run_default(
                data, tmp / f"run{seed}", epochs=None, seed=seed,
                cache=tmp / "cache", extra=tuple(extra),
            )  # fmt: skip
            m = ours["model"]
            arch = {k: m[k] for k in ("patch_size", "embed_dim", "depth", "num_heads", "mlp_dim")}
            img = m["img_size"][0] if isinstance(m["img_size"], list) else m["img_size"]
            theirs = {"top1": None, "steps": None, "wall_s": None}
            if not a.no_baseline:
                torch.set_num_threads(threads)
                theirs = run_photo_baseline(
                    data, arch=arch, img=img, epochs=value if flag == "--epochs" else None, budget=budget,
                    seed=seed, batch=a.baseline_batch,
                )  # fmt: skip
            what = f"{flag} {value:g}" + (f" --img-size {size}" if size else "")
            row = {
                "data": f"photos {Path(a.data).name}, eval {a.split}", "run": what, "seed": seed,
                "ours_top1": ours["top1"], "ours_steps": ours["steps"], "ours_wall_s": round(ours["wall_s"], 1),
                "ours_process_s": round(ours["bench_wall_s"], 1),
                "ours_recipe": ours["recipe_chosen"], "baseline_top1": theirs["top1"],
                "baseline_steps": theirs["steps"], "baseline_wall_s": theirs["wall_s"] and round(theirs["wall_s"], 1),
                "arch": arch, "img": img, "baseline_threads": threads, "train_args": a.train_args,
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            base = "-" if theirs["top1"] is None else f"{100 * theirs['top1']:.1f}% ({theirs['steps']} steps)"
            diff = "-" if theirs["top1"] is None else f"{100 * (ours['top1'] - theirs['top1']):+.1f}"
            print(
                f"| {row['data']} | {what} | {seed} | {100 * ours['top1']:.1f}% ({ours['steps']} steps, "
                f"{row['ours_wall_s']} s) | {base} | {diff} |",
                flush=True,
            )


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
    p.add_argument("--photos", action="store_true", help="--data is a folder of photos: train/, validation/, test/")
    p.add_argument("--split", default="validation", help="with --photos: evaluate on validation (choose) or test")
    p.add_argument("--time-budget", type=float, default=None, help="with --photos: seconds for each side")
    p.add_argument("--photo-rows", action="store_true", help="with --photos: the issue's grid of rows (PHOTO_ROWS)")
    p.add_argument("--photo-baseline", default=None, metavar="SPEC", help=argparse.SUPPRESS)  # busy_machine's child
    a = p.parse_args()
    if a.photo_baseline:
        photo_baseline_child(Path(a.photo_baseline))
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if a.photos:
            photo_rows(a, tmp)
            return
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
