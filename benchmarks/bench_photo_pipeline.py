"""Does the training input pipeline keep up on photos? (issue 34, item 5)

For each training size (``--sizes``) and augmentation level (``--levels``, :data:`vitlab.train.sizing.levels.LEVELS`)
one run's whole input pipeline on a folder of full-size JPEG photos, against timm's loader on the same files and
against the default model's training step, in one process:

1. **vitlab, first decode**: the folder decoded once into the decode cache through the run's own loading path
   (:func:`vitlab.train.engine.run_data.load_run_data`: the run's :func:`~vitlab.train.sizing.side.folder_storage`, JPEG
   draft mode, photos stored with the shorter side about ``size / 0.875``), in a fresh cache under ``--out``; images/s
   of the whole folder (train and held-out), on ``load_data``'s decode threads.
2. **vitlab, epoch**: the run's training loader (:func:`~vitlab.train.engine.loaders.build_folder_loaders` with the
   level's recipe: the crop drawn on the stored photo, flip, RandAugment, normalisation, per-sample seeding) over
   ``--batches`` batches of a fresh epoch, worker start included; once with the threads and workers the run
   chooses (:func:`~vitlab.train.engine.model.build_net`: :func:`~vitlab.train.sizing.machine.set_threads`,
   :func:`~vitlab.train.sizing.machine.workers_for`), and with each of ``--workers``.
3. **timm, epoch**: ``timm.data.create_loader`` (``create_transform`` inside, ``use_prefetcher=False``: the CPU
   path) over ``timm.data.ImageDataset`` of the same files, which decodes every full-size JPEG every epoch: the real
   comparison. Augmentation as close to the level's as timm has: minimal = RandomResizedCrop with scale and ratio
   (1, 1) (the centre square, resized) + flip; light = scale (0.5, 1), ratio (3/4, 4/3), flip, ``rand-m7-n2``
   (timm applies each RandAugment op with probability 0.5, torchvision always); colour jitter off; bilinear.
4. **model step**: the run's model (``auto``'s for this data and size, built by ``build_net``, with the token dropping
   of a ``--time-budget`` run, :data:`~vitlab.train.sizing.recipe.BUDGET_TOKEN_DROP`, in training mode), one
   forward + backward + the recipe's AdamW step (:func:`~vitlab.train.sizing.probe.time_steps`) on the first
   vitlab batch, at each of ``--threads`` torch threads: images/s the model consumes.

**Images/s per core**: wall-clock images/s divided by the cores the configuration occupies: its worker processes
(each runs one torch thread; the main process only receives batches), or, with no workers, the main process's
torch threads (set to 1 for the extra rows). ``img_per_cpu_s`` (images per CPU-second of this process and its
reaped workers, from ``getrusage``) is printed beside it as a check. The table compares the rows at ``--cores``
workers / threads (default 2): pipeline / model = vitlab's epoch img/s over the model's step img/s, vitlab / timm =
the two loaders' per-core rates. Issue 34's target: at 64 px the pipeline delivers at least 3x what the model
consumes and is ahead of timm per core.

One JSON line per row, then a Markdown table (also ``OUT/rows.jsonl``, ``OUT/table.md``). Data: ``--data DIR`` (an
ImageFolder of class folders; 10% is held out as a run holds it out), or a generated folder of photo-like JPEGs of
several sizes and aspect ratios (:data:`PHOTO_SIZES`). Everything is written under ``--out`` (a temporary folder by
default); the decode cache of each size is deleted after it unless ``--keep-cache``.

    python benchmarks/bench_photo_pipeline.py --data ../shared/data/clothing/train --out /tmp/pipe
    python benchmarks/bench_photo_pipeline.py --sizes 64 --levels light --batches 10
    python benchmarks/bench_photo_pipeline.py --smoke          # seconds: tiny photos, one size, what the test runs
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import resource
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import (
    LEVELS,
    FolderLoaders,
    Objective,
    Stopwatch,
    amp,
    batches,
    build_config,
    build_folder_loaders,
    build_net,
    build_objective,
    build_optimizer,
    forward_macs,
    holds_photos,
    level_fields,
    load_run_data,
    photo_pixels,
    recipe_for,
    run_model_config,
    sizing_choose,
    sizing_here,
    time_steps,
)

from vitlab.data import DataSource, load_data
from vitlab.distributed import Dist
from vitlab.models import ViTConfig
from vitlab.train import TrainConfig

PHOTO_SIZES = [(4032, 3024), (3024, 4032), (1920, 1080), (1080, 1920), (400, 533), (533, 400), (400, 711)]
"""(width, height) of the generated photos: 12-MP phone photos both ways, 1080p both ways, the clothing set's
400x533 both ways and a 9:16 portrait."""
SMOKE_SIZES = [(267, 200), (200, 267), (320, 180), (180, 320), (200, 266), (266, 200), (200, 355)]
"""The same aspect ratios at a shorter side of at least 160 px (still photos for the size rule), for ``--smoke``."""
UNIQUE = 4
"""Distinct files generated per size; the rest are copies (decoded as separate files: the cache keys by path)."""
CPU = torch.device("cpu")


@dataclasses.dataclass
class Timed:
    """One loader's pass: images, wall seconds (first batch asked for to last received), CPU seconds of this
    process and its reaped children, and the first batch."""

    images: int
    wall_s: float
    cpu_s: float
    first: Any


def make_photos(root: Path, *, n: int, sizes: Sequence[tuple[int, int]], classes: int = 4, seed: int = 0) -> Path:
    """``root/c<k>/<i>.jpg``: ``n`` photo-like JPEGs (quality 90, ``_common.photo_pixels``), the sizes in
    turn and the classes round robin; :data:`UNIQUE` distinct files per size, the rest byte copies of them."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    made: dict[tuple[tuple[int, int], int], Path] = {}
    for i in range(n):
        size, k = sizes[i % len(sizes)], (i // len(sizes)) % UNIQUE
        path = root / f"c{i % classes}" / f"{i:05d}_{size[0]}x{size[1]}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        if (size, k) in made:
            shutil.copyfile(made[size, k], path)
        else:
            Image.fromarray(photo_pixels(rng, size)).save(path, "JPEG", quality=90)
            made[size, k] = path
    return root


def run_config(data: str, *, size: int, out: Path, time_budget: float, batch: int | None) -> TrainConfig:
    """The configuration of ``vitlab train --data DATA --img-size SIZE --time-budget T [--batch-size B]`` with its
    decode cache and outputs under ``out``."""
    values: dict[str, Any] = {"data": data, "img_size": size, "recipe.name": "auto", "cache_dir": str(out / "cache"),
                              "out": str(out / "run"), "progress": False,
                              "time_budget": time_budget or None}  # fmt: skip
    if batch:
        values["recipe.batch_size"] = batch
    return build_config(values, given=list(values))


def decode(cfg: TrainConfig, *, out: Path) -> tuple[Any, dict[str, Any]]:
    """``(data, row)``: the folder decoded into a fresh cache by the run's own path, and its rate (scikit-learn,
    which holds out the evaluation split, imported first: its import is no part of decoding)."""
    import sklearn.model_selection  # noqa: F401

    clock = Stopwatch()
    data = load_run_data(cfg, _here(), source=DataSource.named(cfg.data), out=out, log=lambda line: None)
    wall = clock.elapsed()
    n = len(data.train) + len(data.val)
    stored = data.train.images
    sides = [min(stored[i].shape[:2]) for i in range(min(len(stored), 64))]
    threads = inspect.signature(load_data).parameters["workers"].default  # what load_run_data decodes with
    return data, {"kind": "vitlab_decode", "images": n, "wall_s": round(wall, 3), "img_per_s": round(n / wall, 1),
                  "decode_threads": threads, "stored_shorter_side": int(np.median(sides)),
                  "plan": data.storage.line}  # fmt: skip


def _here() -> Any:
    """Where the run is sized: this process on the CPU, float32, the run's optimizer builder."""
    return sizing_here(dist=Dist(), device=CPU, amp_dtype=None, t_start=Stopwatch().started,
                       optimizer=build_optimizer)  # fmt: skip


def level_config(cfg: TrainConfig, data: Any, level: str) -> TrainConfig:
    """``cfg`` asking for the recipe a run fits to the data (the ``auto`` recipe, the stored size's ``crop_pct``), with
    the augmentation and regularisation of ``level`` (as a run on these data builds it: photos keep its crop and flip
    only) in place of the one the recipe chose: every field given, so a run of it trains that recipe as it is."""
    recipe, _, _ = recipe_for(cfg, data)
    recipe = recipe.replace(**level_fields(level, photos=holds_photos(data)))
    return dataclasses.replace(cfg, recipe=recipe, recipe_given=[f.name for f in dataclasses.fields(recipe)])


def run_model(cfg: TrainConfig, data: Any) -> tuple[Objective, torch.nn.Module, int, int, Any]:
    """``(objective, net, threads, workers, sizing)`` as the run chooses and builds them."""
    here = _here()
    objective = build_objective(cfg, cfg.recipe, data, device=CPU)
    sizing = sizing_choose(
        cfg,
        data=data,
        here=here,
        num_classes=data.num_classes,
        log=lambda line: None,
        architecture=lambda r: run_model_config(cfg, r, data, objective=type(objective), init=None),
    )
    net, _ = build_net(cfg, sizing, data, objective=objective, init=None, dist=Dist(), device=CPU)
    return objective, net, torch.get_num_threads(), sizing.workers, sizing


def folder_loaders(
    cfg: TrainConfig, data: Any, net: torch.nn.Module, objective: Objective, sizing: Any
) -> FolderLoaders:
    """The run's training loaders with the sizing's workers."""
    vit = objective.exported(net)
    return build_folder_loaders(cfg, sizing, data=data, model_config=vit.config, dist=Dist(), device=CPU)


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def time_batches(make: Callable[[], Iterable[Any]], *, n: int, threads: int) -> Timed:
    """Up to ``n`` batches of the iterable ``make()`` returns (a fresh epoch: workers start inside the timing), with
    torch at ``threads`` threads in this process; the iterator is closed (its workers ended and reaped) before the
    CPU time is read."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    cpu0, clock = _cpu_seconds(), Stopwatch()
    it = iter(make())
    first, images = None, 0
    try:
        for i, (x, y) in enumerate(it):
            first = (x, y) if first is None else first
            images += len(x)
            if i + 1 >= n:
                break
        wall = clock.elapsed()
    finally:
        getattr(it, "close", lambda: None)()
        torch.set_num_threads(before)
    return Timed(images=images, wall_s=wall, cpu_s=_cpu_seconds() - cpu0, first=first)


def loader_row(kind: str, t: Timed, *, workers: int, threads: int, **extra: Any) -> dict[str, Any]:
    """A loader's row: plain images/s, images/s per core occupied (see the module's notes) and per CPU-second."""
    cores = workers or threads
    rate = t.images / t.wall_s
    return {"kind": kind, "workers": workers, "main_threads": threads, "cores": cores, "images": t.images,
            "wall_s": round(t.wall_s, 3), "img_per_s": round(rate, 1), "img_per_s_per_core": round(rate / cores, 1),
            "img_per_cpu_s": round(t.images / max(t.cpu_s, 1e-9), 1), **extra}  # fmt: skip


def vitlab_rows(
    cfg: TrainConfig, data: Any, *, extra_workers: Sequence[int], n: int
) -> tuple[list[dict[str, Any]], Any, Objective, torch.nn.Module]:
    """vitlab's epoch rows: the run's own threads and workers first, then each of ``extra_workers`` (one torch
    thread in this process); with the first batch of the run's configuration and the run's model."""
    objective, net, threads, run_workers, sizing = run_model(cfg, data)
    configs = [(run_workers, threads if run_workers == 0 else 1, True)]
    configs += [(w, 1, False) for w in extra_workers if not (w == run_workers and (w > 0 or threads == 1))]
    rows, first = [], None
    for workers, main_threads, is_run in configs:
        loaders = folder_loaders(cfg, data, net, objective, dataclasses.replace(sizing, workers=workers))
        t = time_batches(
            lambda lo=loaders: lo.train_batches(0), n=min(n, loaders.micro_per_epoch), threads=main_threads
        )
        first = first if first is not None else t.first
        rows.append(
            loader_row("vitlab_epoch", t, workers=workers, threads=main_threads, run_choice=is_run, batch=loaders.micro)
        )
    return rows, first, objective, net


def timm_loader(root: str, mc: ViTConfig, *, level: str, batch: int, workers: int) -> Any:
    """timm's training loader of ``root`` at the size and normalisation of the model ``mc`` with the augmentation
    closest to ``level``'s (see the module's notes)."""
    import timm.data

    light = level != "minimal"
    scale, ratio = ((0.5, 1.0), (3 / 4, 4 / 3)) if light else ((1.0, 1.0), (1.0, 1.0))
    aug = {"scale": scale, "ratio": ratio, "hflip": 0.5, "color_jitter": None, "interpolation": "bilinear",
           "auto_augment": "rand-m7-n2" if light else None}  # fmt: skip
    return timm.data.create_loader(
        timm.data.ImageDataset(root), input_size=(3, *mc.img_size), batch_size=batch, is_training=True, **aug,
        mean=tuple(mc.mean), std=tuple(mc.std), num_workers=workers, use_prefetcher=False, persistent_workers=False,
        device=CPU,
    )  # fmt: skip


def timm_rows(root: str, mc: ViTConfig, *, level: str, batch: int, workers: Sequence[int], n: int) -> list[dict]:
    """timm's epoch rows, one per worker count (one torch thread in this process)."""
    rows = []
    for w in workers:
        loader = timm_loader(root, mc, level=level, batch=batch, workers=w)
        t = time_batches(lambda lo=loader: batches(lo), n=min(n, len(loader)), threads=1)
        rows.append(loader_row("timm_epoch", t, workers=w, threads=1, batch=batch))
    return rows


def model_rows(
    cfg: TrainConfig, net: torch.nn.Module, objective: Objective, batch: Any, *, threads: Sequence[int], steps: int
) -> list[dict[str, Any]]:
    """Images/s the run's model consumes in training steps on ``batch``, at each of ``threads``."""
    xs, ys = batch
    amp_dtype, _ = amp(cfg.precision, CPU)
    vit = objective.exported(net)
    c = vit.config
    macs = forward_macs(cfg.recipe.arch, c.img_size, c.in_chans, token_drop=c.patch_drop_rate)  # tokens kept
    before, rows = torch.get_num_threads(), []
    for t in threads:
        torch.set_num_threads(t)
        opt = build_optimizer(net, cfg.recipe, cfg.recipe.scaled_lr(len(xs)))
        step_s = time_steps(
            net, opt, xs, ys, objective=objective, device=CPU, amp_dtype=amp_dtype, n_warm=1, n_time=steps
        )
        rows.append({"kind": "model_step", "threads": t, "batch": len(xs), "step_s": round(step_s, 4),
                     "img_per_s": round(len(xs) / step_s, 1), "model": c.name, "patch": c.patch_size,
                     "width": c.embed_dim, "depth": c.depth, "token_drop": c.patch_drop_rate,
                     "gmacs_per_step": round(3 * macs * len(xs) / 1e9, 2)})  # fmt: skip
    torch.set_num_threads(before)
    return rows


def bench_size(args: argparse.Namespace, size: int, *, out: Path, emit: Callable[[dict[str, Any]], None]) -> None:
    """Every row of one training size: the decode once, then each level's loaders and model step."""
    cfg = run_config(args.data, size=size, out=out, time_budget=args.time_budget, batch=args.batch)
    data, row = decode(cfg, out=out)
    emit({"size": size, **row})
    try:
        for level in args.levels:
            cfg_l = level_config(cfg, data, level)
            rows, first, objective, net = vitlab_rows(cfg_l, data, extra_workers=args.workers, n=args.batches)
            for r in rows:
                emit({"size": size, "level": level, **r})
            mc, n_timm = objective.exported(net).config, args.timm_batches or args.batches
            for r in timm_rows(args.data, mc, level=level, batch=len(first[0]), workers=args.workers, n=n_timm):
                emit({"size": size, "level": level, **r})
            for r in model_rows(cfg_l, net, objective, first, threads=args.threads, steps=args.steps):
                emit({"size": size, "level": level, **r})
    finally:
        if not args.keep_cache:  # the folder under --out this size's run decoded into
            shutil.rmtree(cfg.cache_dir, ignore_errors=True)


def table(rows: list[dict[str, Any]], *, cores: int) -> str:
    """The Markdown table of ``rows``: one line per size and level, loaders at ``cores`` workers, the model at
    ``cores`` threads."""

    def pick(kind: str, size: int, level: str | None, **match: Any) -> dict[str, Any] | None:
        found = [
            r
            for r in rows
            if r["kind"] == kind
            and r["size"] == size
            and r.get("level") == level
            and all(r.get(k) == v for k, v in match.items())
        ]
        return found[0] if found else None

    def rate(r: dict[str, Any] | None, per_core: bool = True) -> str:
        if r is None:
            return "-"
        return f"{r['img_per_s']:,.0f} ({r['img_per_s_per_core']:,.0f})" if per_core else f"{r['img_per_s']:,.0f}"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    head = (
        f"| size | level | vitlab epoch img/s ({cores} workers; per core) | the run's choice: img/s | vitlab first "
        f"decode img/s | timm img/s ({cores} workers; per core) | model step img/s ({cores} threads) | "
        "pipeline / model | vitlab / timm per core |"
    )
    lines = [head, "|" + "---|" * 9]
    for size, level in dict.fromkeys((r["size"], r["level"]) for r in rows if "level" in r):
        v, timm = pick("vitlab_epoch", size, level, workers=cores), pick("timm_epoch", size, level, workers=cores)
        run, dec = pick("vitlab_epoch", size, level, run_choice=True), pick("vitlab_decode", size, None)
        model = pick("model_step", size, level, threads=cores)
        choice = f"{rate(run, False)} ({run['main_threads']} thr, {run['workers']} wkr)" if run else "-"
        lines.append(
            f"| {size} | {level} | {rate(v)} | {choice} | {rate(dec, False)} | {rate(timm)} | {rate(model, False)} | "
            f"{ratio(v and v['img_per_s'], model and model['img_per_s'])} | "
            f"{ratio(v and v['img_per_s_per_core'], timm and timm['img_per_s_per_core'])} |"
        )
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="an ImageFolder of class folders (default: generate --images photos)")
    ap.add_argument("--images", type=int, default=448, help="photos generated without --data")
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 224])
    ap.add_argument("--levels", nargs="+", default=["minimal", "light"], choices=list(LEVELS))
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="DataLoader workers of the extra rows")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="torch threads of the model step rows")
    ap.add_argument("--cores", type=int, default=2, help="the workers / threads the table compares")
    ap.add_argument("--batches", type=int, default=20, help="batches timed per loader (at most one epoch)")
    ap.add_argument("--timm-batches", type=int, default=None, help="batches timed per timm loader (default: --batches)")
    ap.add_argument("--steps", type=int, default=3, help="timed training steps (after one untimed)")
    ap.add_argument("--batch", type=int, default=None, help="the batch (default: the run's, at most 128)")
    ap.add_argument("--time-budget", type=float, default=600.0, help="the run's --time-budget (0: none, no token drop)")
    ap.add_argument("--out", type=Path, default=None, help="rows, table, data and cache (default: a temporary folder)")
    ap.add_argument("--keep-cache", action="store_true", help="keep each size's decode cache")
    ap.add_argument("--smoke", action="store_true", help="tiny photos, one small size, few batches: seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.images, args.sizes, args.batches, args.steps, args.workers, args.threads = 32, [32], 2, 1, [0, 1], [1]
        args.cores = 1
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="bench_photo_pipeline_") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        if args.data is None:
            sizes = SMOKE_SIZES if args.smoke else PHOTO_SIZES
            args.data = str(make_photos(out / "photos", n=args.images, sizes=sizes))
        rows: list[dict[str, Any]] = []

        def emit(row: dict[str, Any]) -> None:
            rows.append(row)
            print(json.dumps(row), flush=True)

        for size in args.sizes:
            bench_size(args, size, out=out, emit=emit)
        text = table(rows, cores=args.cores)
        print(text)
        if args.out is not None:
            (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (out / "table.md").write_text(text + "\n")
    return rows


if __name__ == "__main__":
    main()
