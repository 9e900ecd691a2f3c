"""A run's data: the splits (rank 0 builds the decode cache first), stored at the size the run trains at
(:func:`folder_plan`: decided from the files' headers before anything is decoded, see
:mod:`vitlab.train.spec.image_size`), and their fingerprint, which ``--resume`` checks."""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..._fs import atomic_write_text
from ...data import load_data
from ...data.cache import cache_key
from ...data.cache_admin import cache_line
from ...data.decode import too_thin, typical_side
from ...data.scan import scan_classes
from ...data.shard_source import is_shard_spec, open_source
from ...data.sources import DataError, DataSplits, FolderPlan, builtin_data, data_folder
from ...data.stream import open_stream_data
from ...data.transforms import resize_side
from ...distributed import Dist, barrier
from ..persist.advice import top1_stderr
from ..spec.config import TrainConfig
from ..spec.image_size import (
    CROP_MARGIN,
    INIT_SIDE,
    PHOTO_CROP_PCT,
    PHOTO_SIDE,
    PHOTO_SIZE,
    budget_photo_side,
    photo_size,
    store_side,
)

__all__ = [
    "SMALL_EVAL_PER_CLASS",
    "check_data_unchanged",
    "data_fingerprint",
    "data_location",
    "data_record",
    "eval_split_lines",
    "folder_plan",
    "load_run_data",
    "run_data_fingerprint",
]

SMALL_EVAL_PER_CLASS = 50
"""Fewer evaluation images a class than this, and a run on the user's data says that its accuracy is noisy: at 50 a
class, one image is 2 points of a class's accuracy, and top-1's standard error over 10 classes is about 2 points."""


def load_run_data(
    cfg: TrainConfig, *, dist: Dist, out: Path, log: Callable[[str], None], labels: bool = True,
    init_size: int | None = None, passes: Callable[[int, int], float] | None = None,
) -> DataSplits:  # fmt: skip
    """The run's train and evaluation splits. Rank 0 decodes first (and writes the shared cache)
    while the others wait; undecodable files are listed in ``out/bad_files.txt``. A folder is stored at the
    size the run trains at, decided from its headers first (:func:`folder_plan`; ``init_size``: the ``--init``
    model's side, the size a fine-tune without ``--img-size`` trains at; ``passes``: what a time budget buys at a
    side, for photos), and the choice is the first line logged."""
    if is_shard_spec(cfg.data):  # tar shards: read as they train, no decode cache
        data = open_stream_data(cfg.data, val_split=cfg.val_split, allow_pipe=cfg.allow_pipe)
        if len(data.train) == 0 or len(data.val) == 0:
            raise DataError(f"--data {cfg.data}: empty train or evaluation split")
        return data

    def get_data():
        return load_data(
            cfg.data,
            val_split=cfg.val_split,
            plan=functools.partial(folder_plan, cfg, init_size=init_size, passes=passes),
            cache_dir=cfg.cache_dir,
            strict=cfg.strict_data,
            progress=cfg.progress and dist.is_main,
            max_image_pixels=cfg.max_image_pixels,
            buffer_bytes=cfg.memory_budget,
            min_classes=1 if cfg.allow_single_class or not labels else 2,  # an objective without labels: 1
        )

    if dist.is_main:
        data = get_data()
    barrier(dist)
    if not dist.is_main:
        data = get_data()
    if data.plan is not None:
        log(data.plan.line)
    if (line := cache_line(data.cache_files)) is not None:
        log(line)
    if data.skipped:
        log(f"warning: skipped {len(data.skipped)} file(s) that cannot be decoded; list in {out / 'bad_files.txt'}")
        if dist.is_main:
            atomic_write_text(out / "bad_files.txt", "".join(f"{p}\t{why}\n" for p, why in data.skipped))
    if data.num_classes == 1 and labels:
        log(f"warning: --data {cfg.data}: only one class ({data.class_names[0]!r}); top-1 is 100% by construction")
    if len(data.train) == 0 or len(data.val) == 0:
        raise DataError(f"--data {cfg.data}: empty train or evaluation split")
    for line in eval_split_lines(data, spec=cfg.data, labels=labels, asked=cfg.val_split is not None):
        log(line)
    return data


def eval_split_lines(data: Any, *, spec: str, labels: bool = True, asked: bool = False) -> list[str]:
    """What a run on a folder says about its evaluation split: the split held out (its size, where from, how to
    change it; ``asked``: by ``--val-split``, else because the folder has none), and a warning when it has fewer than
    :data:`SMALL_EVAL_PER_CLASS` images a class (with the standard error of its top-1). Nothing for the built-in
    data sets, whose splits are fixed and known."""
    if data_folder(spec) is None:
        return []
    n, total = len(data.val), len(data.train) + len(data.val)
    lines = []
    if getattr(data, "held_out", None) is not None:
        why = (
            "by --val-split"
            if asked
            else f"as {spec} has no val/ or test/ folder: --val-split F to change it, or add a val/ folder"
        )
        lines.append(
            f"evaluation split: {n:,} of the {total:,} images held out ({data.held_out:.0%} of each class, seed 0), "
            + why
        )
    per_class = n / max(1, data.num_classes)
    if labels and per_class < SMALL_EVAL_PER_CLASS:
        lines.append(
            f"warning: {n:,} evaluation images ({data.val_name}), about {per_class:.0f} a class: one image is "
            f"{100 / n:.2g} points of top-1, and its standard error is up to +/-{top1_stderr(0.5, n):.1f} points; "
            f"differences smaller than twice that are noise ({SMALL_EVAL_PER_CLASS} a class or more to tell them)"
        )
    return lines


def data_location(spec: str) -> str:
    """``--data`` as a run records it, usable from any folder: an existing path made absolute, a local tar-shard
    pattern joined to the current folder; a built-in name (``digits``, ``cifar10``) or a URL as given (a built-in name
    is the data set even where a folder of that name exists: :func:`~vitlab.data.sources.builtin_data`)."""
    if builtin_data(spec) is not None:
        return spec
    p = Path(spec).expanduser()
    if p.exists():
        return str(p.resolve())
    if is_shard_spec(spec) and "://" not in spec and not spec.startswith(("pipe:", "file:")):
        return os.path.abspath(p)
    return spec


def data_record(cfg: TrainConfig, data: Any, fingerprint: dict[str, Any] | None) -> dict[str, Any]:
    """What a run's ``model/`` records of its data: its location (:func:`data_location`), fingerprint
    (:func:`data_fingerprint`), ``--val-split`` and, for a folder, how it was stored (``data_plan``: what
    ``vitlab eval`` needs to read the same decode cache)."""
    plan = getattr(data, "plan", None)
    return {
        "data": data_location(cfg.data),
        "data_fingerprint": fingerprint,
        "val_split": cfg.val_split,
        **({"data_plan": plan.record()} if plan is not None else {}),
    }


def data_fingerprint(cfg: TrainConfig) -> dict[str, Any] | None:
    """What a folder run trains on, kept in ``last.pt`` so that ``--resume`` can tell whether the data changed:
    the class names and, per split folder, its number of image files and the decode cache's key of their
    paths, sizes and modification times (:func:`vitlab.data.cache.cache_key`). The files are listed as
    :func:`vitlab.data.load_data` lists them (only their metadata is read). None for the built-in
    datasets (digits, CIFAR), which do not change, and for a ``--data`` that is no folder."""
    if is_shard_spec(cfg.data):  # the shards' names, sample counts and checksums
        return open_source(cfg.data, val_split=cfg.val_split, allow_pipe=cfg.allow_pipe).fingerprint()
    root = data_folder(cfg.data)  # (a built-in name is never a folder: `--out digits` is not read as data)
    if root is None:
        return None
    train = root / "train"
    val = next((root / n for n in ("val", "valid", "validation", "test") if (root / n).is_dir()), None)
    if train.is_dir() and val is not None and cfg.val_split is None:  # load_data's choice of split folders
        dirs = {"train": train, val.name: val}
    else:
        dirs = {train.name if train.is_dir() else ".": train if train.is_dir() else root}
    classes: list[str] | None = None
    splits = {}
    for name, d in dirs.items():
        paths, _, found = scan_classes(d, classes)
        classes = classes or found
        splits[name] = {"files": len(paths), "key": cache_key(paths, None, "fingerprint")}
    return {"classes": classes, "splits": splits}


def run_data_fingerprint(
    cfg: TrainConfig, *, state: dict[str, Any] | None, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """The data fingerprint a run keeps in ``last.pt`` (:func:`data_fingerprint`, taken before decoding):
    a new run's, now. A resumed run keeps the one saved when it started, after checking that the data
    still matches it (:func:`check_data_unchanged`); a checkpoint from before fingerprints resumes as it
    did, with a note, and keeps today's from then on."""
    now = data_fingerprint(cfg)
    if state is None:
        return now
    if "data_fingerprint" not in state:
        log("note: this last.pt predates data fingerprints: the data is not checked against the run's start")
        return now
    saved = _saved_fingerprint(state["data_fingerprint"])
    check_data_unchanged(saved, now, data=cfg.data)
    return saved


def _saved_fingerprint(text: Any) -> dict[str, Any] | None:
    """The data fingerprint ``last.pt`` saved (JSON: None, or class names and per split a count and a key), checked:
    a :class:`~vitlab.data.sources.DataError` line when it is not what :func:`data_fingerprint` writes."""
    try:
        saved = json.loads(text) if isinstance(text, str) else text
    except (ValueError, RecursionError):
        saved = ...
    if saved is None:
        return None
    splits = saved.get("splits") if isinstance(saved, dict) else None
    ok = (
        isinstance(saved, dict)
        and isinstance(saved.get("classes"), list)
        and all(isinstance(c, str) for c in saved["classes"])
        and isinstance(splits, dict)
        and all(
            isinstance(v, dict) and isinstance(v.get("files"), int) and isinstance(v.get("key"), str)
            for v in splits.values()
        )
    )
    if not ok:
        raise DataError(
            "--resume: last.pt's data fingerprint is not one vitlab wrote (class names, and per split a file count "
            "and a key); start a new run (--out elsewhere or --overwrite)"
        )
    return saved


def check_data_unchanged(saved: dict[str, Any] | None, now: dict[str, Any] | None, *, data: str) -> None:
    """Refuse to resume on data other than the run started with (``saved`` and ``now`` are fingerprints
    of :func:`data_fingerprint`): one :class:`~vitlab.data.sources.DataError` that lists what changed.
    A resumed run on other files would train a different model (or stop early: fewer steps per epoch)
    or fail to load its weights (a class added)."""
    if saved is None or now is None:  # a built-in dataset; a --data folder that is gone fails as it loads
        return
    changes = [f"class {c!r} added" for c in now["classes"] if c not in saved["classes"]]
    changes += [f"class {c!r} removed" for c in saved["classes"] if c not in now["classes"]]
    for name in {**saved["splits"], **now["splits"]}:
        a, b = saved["splits"].get(name), now["splits"].get(name)
        if a is None or b is None:
            changes.append(f"split folder {name!r} {'added' if a is None else 'removed'}")
        elif b["files"] != a["files"]:
            n = b["files"] - a["files"]
            changes.append(f"{abs(n)} file(s) {'added to' if n > 0 else 'removed from'} {name}")
        elif b["key"] != a["key"]:
            changes.append(f"files in {name} renamed, replaced or modified ({a['files']} files either way)")
    if changes:
        raise DataError(
            f"--resume: the data changed since the run started ({data}): {', '.join(changes)}; "
            "start a new run (--out elsewhere or --overwrite)"
        )


def folder_plan(
    cfg: TrainConfig, counts: Mapping[tuple[int, int], int], *, init_size: int | None = None,
    n_files: int | None = None, passes: Callable[[int, int], float] | None = None,
) -> FolderPlan:  # fmt: skip
    """How a run stores a folder whose training split's headers give ``counts`` (``(width, height) -> count``; the
    conventions: :mod:`vitlab.train.spec.image_size`), with the line that says what was chosen and why. A fine-tune
    without ``--img-size`` trains at its ``--init`` model's side, ``init_size`` (None: not known, photos are then
    stored for up to :data:`~vitlab.train.spec.image_size.INIT_SIDE`). ``passes(side, n_train)``: the passes a time
    budget buys at a side (:func:`~vitlab.train.engine.calibrate.budget_passes`), for photos without a size given
    (:func:`~vitlab.train.spec.image_size.budget_photo_side`); ``n_files``: the training split's files (default:
    the headers counted)."""
    pictures = {wh: n for wh, n in counts.items() if not too_thin(*wh)} or dict(counts)
    typical = typical_side(pictures)
    w, h = max((wh for wh in pictures if min(wh) == typical), key=pictures.__getitem__)
    uniform = len(pictures) == 1
    photos = typical >= PHOTO_SIDE
    r = cfg.recipe
    crop_pct = r.crop_pct if r.crop_pct < 1 else PHOTO_CROP_PCT if photos else 1.0
    given = cfg.img_size or r.img_size
    seen = f"images: {w}x{h}" if uniform else f"images: typical {w}x{h} (mixed sizes)"
    if given:
        side = given
        why = "--img-size" if cfg.img_size else f"the {r.name} recipe's size"
    elif cfg.init:
        side, why = init_size, "the --init model's size"
    elif photos and passes is not None:
        n_train = n_files or sum(counts.values())
        side, why = budget_photo_side(typical, lambda s: passes(s, n_train))
    elif photos:
        side = photo_size(typical)
        why = "photos: the usual ViT input; --img-size to change" if side == PHOTO_SIZE else "their own size"
    else:
        side, why = None, ""
    if side is not None:
        size: tuple[int, int] | None = (side, side)
        keep = store_side(side, crop_pct)
        to = f"training at {side} px ({why})"
    elif cfg.init:
        size, keep = None, math.ceil(INIT_SIDE / CROP_MARGIN) if photos else store_side(typical)
        to = "training at the --init model's size"
    else:  # small images: their own size, or the median shorter side of mixed sizes
        size = (h, w) if uniform else (typical, typical)
        keep = store_side(typical)
        to = "training at their own size" if uniform else f"training at {typical} px (the median shorter side)"
    if cfg.pack_res is not None:  # an image at --pack-res HIGH's budget has a shorter side of at most HIGH
        keep = max(keep, math.ceil(cfg.pack_res[1]))
    square = size is not None and size[0] == size[1]
    eval_side = resize_side(size[0], crop_pct) if square and size and (photos or not uniform) else None
    if cfg.pack:  # evaluated at their own aspect ratio too: stored whole, as the training images
        eval_side = None
    stored = f"stored with the shorter side at most {keep} px, aspect ratio kept"
    if uniform and min(w, h) <= keep:
        stored = "stored as they are"
    how = "resize shorter side + centre crop for evaluation" if square else "resized to the input for evaluation"
    line = f"{seen} -> {to}; {stored}; {how}, crop_pct {crop_pct:g}"
    return FolderPlan(size=size, store_side=keep, eval_side=eval_side, crop_pct=crop_pct, typical=typical, line=line)
