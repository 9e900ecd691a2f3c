"""A run's data: the splits (rank 0 builds the decode cache first), stored for the side the run trains at (chosen by
the sizing's side rule from the files' headers before anything is decoded,
:func:`vitlab.train.sizing.side.folder_storage`; tar shards from their first samples' headers, by the same rule), and
their fingerprint, which ``--resume`` checks.

The data check a run on a folder starts with (:func:`check_before`, :func:`check_after`; :mod:`vitlab.data.check`):
every file read once for its content hash and perceptual fingerprint (kept in the decode cache's folder, so a second run
reads only what changed), one line per kind of finding, the report in ``OUT/data_check.json``, and the run goes on;
``--strict-data`` stops on leaks and conflicting labels, ``--dedup-eval`` leaves the leaked evaluation images out of the
evaluation.

A folder with its own evaluation split (``train/`` + ``val/``) is checked before it is decoded, and its lines are the
run's first. A class tree whose evaluation split the run holds out is checked before too, but its leaks (images on
both sides of the split) are known once the split is made: its lines follow the decoding. Built-in data sets are not
checked (they are what they are); tar shards are not either (one line says so: check the folder they came from)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..._fs import atomic_write_text
from ..._text import shell_word
from ...data import load_data
from ...data.cache.admin import cache_line
from ...data.cache.store import cache_key, default_cache_dir
from ...data.check import REPORT_NAME, DataCheck, check_folder
from ...data.images.scan import scan_classes
from ...data.shards.source import is_shard_spec, open_source
from ...data.shards.stream import open_stream_data
from ...data.sources import DataError, DataSource, DataSplits, FolderStorage, builtin_data
from ...distributed import Dist, barrier
from ...models.config import ViTConfig
from ..conf.train_config import TrainConfig
from ..persist.advice import top1_stderr
from ..sizing.probe import Here, budget_passes, wants_budget_size
from ..sizing.side import folder_storage

__all__ = [
    "REPORT_NAME",
    "SMALL_EVAL_PER_CLASS",
    "check_after",
    "check_before",
    "check_data_unchanged",
    "data_fingerprint",
    "data_location",
    "data_record",
    "eval_split_lines",
    "load_run_data",
    "run_data_fingerprint",
]

SMALL_EVAL_PER_CLASS = 50
"""Fewer evaluation images a class than this, and a run on the user's data says that its accuracy is noisy: at 50 a
class, one image is 2 points of a class's accuracy, and top-1's standard error over 10 classes is about 2 points."""


def load_run_data(
    cfg: TrainConfig, here: Here, *, source: DataSource, out: Path, log: Callable[[str], None], labels: bool = True,
    init: ViTConfig | None = None, teacher: ViTConfig | None = None, storage: FolderStorage | None = None,
) -> DataSplits:  # fmt: skip
    """The run's train and evaluation splits of ``source`` (its ``--data``, told once), stored for the side the run
    trains at, which the sizing's side rule chooses from the images' sizes
    (:func:`~vitlab.train.sizing.side.folder_storage`: a folder's headers, tar shards' first samples; ``init``:
    the ``--init`` model's configuration, whose side a fine-tune without ``--img-size`` trains at; for photos under a
    time budget, the passes it buys at each side, timed first: :func:`~vitlab.train.sizing.probe.budget_passes`,
    with a distillation ``teacher``'s forward);
    ``storage``: a resumed or replayed run's (chosen before: kept).
    The data check's lines come first (:mod:`.data_check`: ``out/data_check.json``; ``--strict-data`` stops on leaks
    and conflicting labels, ``--dedup-eval`` leaves the leaked evaluation images out), then the choice of side.
    Rank 0 decodes first (and writes the shared cache) while the others wait; undecodable files are listed in
    ``out/bad_files.txt``."""
    dist = here.dist
    check = check_before(cfg, source, out=out, log=log, dist=dist) if dist.is_main else None  # the first lines
    passes = None
    if storage is None and wants_budget_size(cfg, source, uses_labels=labels, dist=dist, init=init):
        passes = budget_passes(cfg, here, init=init, teacher=teacher)
    storing = storage or functools.partial(folder_storage, cfg, init=init, passes=passes)
    if source.shards:  # tar shards: read as they train, no decode cache; their side by the same rule
        data = open_stream_data(source.spec, val_split=cfg.val_split, allow_pipe=cfg.allow_pipe)
        if len(data.train) == 0 or len(data.val) == 0:
            raise DataError(f"--data {source.spec}: empty train or evaluation split")
        data.storage = storage or storing(data.sizes, n_files=len(data.train), shards=True)
        log(data.storage.line)
        return data

    def get_data():
        return load_data(
            source.spec,
            val_split=cfg.val_split,
            storage=storing,
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
        check = check_before(cfg, source, out=out, log=log, dist=dist)  # (only for --dedup-eval: rank 0's hashes kept)
        data = get_data()
    if data.storage is not None:
        log(data.storage.line)
    if (line := cache_line(data.cache_files)) is not None:
        log(line)
    if data.skipped:
        (first, why), n = data.skipped[0], len(data.skipped)  # (not decodable, or left out by the folder walk)
        log(f"warning: skipped {n} file(s) that cannot be used (e.g. {first}: {why}); list in {out / 'bad_files.txt'}")
        if dist.is_main:
            atomic_write_text(out / "bad_files.txt", "".join(f"{p}\t{why}\n" for p, why in data.skipped))
    if data.num_classes == 1 and labels:
        log(f"warning: --data {source.spec}: only one class ({data.class_names[0]!r}); top-1 is 100% by construction")
    if len(data.train) == 0 or len(data.val) == 0:
        raise DataError(f"--data {source.spec}: empty train or evaluation split")
    data = check_after(check, data, cfg, out=out, log=log, dist=dist)
    for line in eval_split_lines(data, source, labels=labels, asked=cfg.val_split is not None, out=out):
        log(line)
    return data


def eval_split_lines(
    data: Any, source: DataSource, *, labels: bool = True, asked: bool = False, out: Path | None = None
) -> list[str]:
    """What a run on a folder says about its evaluation split: the split held out (its size, where from, how to
    change it; ``asked``: by ``--val-split``, else because the folder has none), the other evaluation folders it
    leaves alone (``test/`` beside ``val/``: a final test, and how to run it on the run's ``out``), and a warning
    when it has fewer than :data:`SMALL_EVAL_PER_CLASS` images a class (with the standard error of its top-1).
    Nothing for the built-in data sets, whose splits are fixed and known, and for tar shards, whose splits were made
    when they were packed."""
    if source.folder is None:
        return []
    n, total = len(data.val), len(data.train) + len(data.val)
    lines = []
    if others := getattr(data, "left_alone", ()):
        model = shell_word(str(out / "model")) if out is not None else "RUN/model"
        lines.append(
            f"evaluation split: {data.val_name}/ ({n:,} images); {', '.join(d + '/' for d in others)} left alone "
            f"for a final test: vitlab eval --model {model} --data {shell_word(str(source.folder / others[0]))}"
        )
    if getattr(data, "held_out", None) is not None:
        why = (
            "by --val-split"
            if asked
            else f"as {source.spec} has no val/ or test/ folder: --val-split F to change it, or add a val/ folder"
        )
        how = "of each class" if data.by_class else "at random"
        note = "" if data.by_class else "; not of each class, which takes two images a class and room for one of each"
        lines.append(
            f"evaluation split: {n:,} of the {total:,} images held out ({data.held_out:.0%} {how}, seed 0{note}), "
            + why
        )
    per_class = n / max(1, data.num_classes)
    if labels and per_class < SMALL_EVAL_PER_CLASS:
        lines.append(
            f"warning: {n:,} evaluation images ({data.val_name}), about {per_class:.2g} a class: one image is "
            f"{100 / n:.3g} points of top-1, and its standard error is up to +/-{top1_stderr(0.5, n):.1f} points; "
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
    (:func:`data_fingerprint`), ``--val-split`` and, for a folder, how it was stored (``data_storage``: what
    ``vitlab eval`` needs to read the same decode cache)."""
    stored = getattr(data, "storage", None)
    return {
        "data": data_location(cfg.data),
        "data_fingerprint": fingerprint,
        "val_split": cfg.val_split,
        **({"data_storage": stored.record()} if stored is not None else {}),
    }


def data_fingerprint(cfg: TrainConfig, source: DataSource) -> dict[str, Any] | None:
    """What a folder run trains on, kept in ``last.pt`` so that ``--resume`` can tell whether the data changed:
    the class names and, per split folder, its number of image files and the decode cache's key of their
    paths, sizes and modification times (:func:`vitlab.data.cache.store.cache_key`). The files are listed as
    :func:`vitlab.data.load_data` lists them (only their metadata is read). None for the built-in
    datasets (digits, CIFAR), which do not change, and for a ``--data`` that is no folder."""
    if source.shards:  # the shards' names, sample counts and checksums
        return open_source(source.spec, val_split=cfg.val_split, allow_pipe=cfg.allow_pipe).fingerprint()
    root = source.folder  # (a built-in name is never a folder: `--out digits` is not read as data)
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
    cfg: TrainConfig, source: DataSource, *, state: dict[str, Any] | None, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """The data fingerprint a run keeps in ``last.pt`` (:func:`data_fingerprint`, taken before decoding):
    a new run's, now. A resumed run keeps the one saved when it started, after checking that the data
    still matches it (:func:`check_data_unchanged`); a checkpoint from before fingerprints resumes as it
    did, with a note, and keeps today's from then on."""
    now = data_fingerprint(cfg, source)
    if state is None:
        return now
    if "data_fingerprint" not in state:
        log("note: this last.pt predates data fingerprints: the data is not checked against the run's start")
        return now
    saved = _saved_fingerprint(state["data_fingerprint"])
    check_data_unchanged(saved, now, data=source.spec)
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


# -- the data check ------------------------------------------------------------------------------------------------

SHARDS_LINE = "data check: tar shards are not checked (vitlab data check DIR checks the folder they were packed from)"


def check_before(
    cfg: TrainConfig, source: DataSource, *, out: Path, log: Callable[[str], None], dist: Dist
) -> DataCheck | None:
    """The check of the run's ``--data`` (``source``) before it is decoded (None for data that is no folder). A
    folder with its own evaluation split: its lines now, and ``--strict-data`` refuses here. Only rank 0 checks,
    unless the run changes its evaluation split by it (``--dedup-eval``: every rank must leave out the same images;
    the others then read the hashes rank 0 kept)."""
    if source.shards:
        log(SHARDS_LINE)
        return None
    root = source.folder
    if root is None or not (dist.is_main or cfg.dedup_eval):
        return None
    check = check_folder(
        root, val_split=cfg.val_split, progress=cfg.progress and dist.is_main, max_pixels=cfg.max_image_pixels,
        cache_dir=Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir(),
    )  # fmt: skip
    if not check.held_out:
        _say(check, cfg, out=out, log=log, dist=dist)
    return check


def _say(check: DataCheck, cfg: TrainConfig, *, out: Path, log: Callable[[str], None], dist: Dist) -> None:
    """The check's lines, its report written (rank 0), and ``--strict-data``'s refusal."""
    where = out / REPORT_NAME
    for line in check.lines(where=str(where), dedup=cfg.dedup_eval):
        log(line)
    if dist.is_main:
        _write(check, where, dedup=None)
    if cfg.strict_data and (why := check.refusal()):
        raise DataError(
            f"data check: {why} (--strict-data); list in {where}: remove or move them, or drop --strict-data"
        )


def _write(check: DataCheck, where: Path, *, dedup: dict[str, int] | None) -> None:
    report = check.report()
    if dedup is not None:
        report["dedup_eval"] = dedup
    atomic_write_text(where, json.dumps(report, indent=1) + "\n", what="the data check's report")


def check_after(
    check: DataCheck | None, data: DataSplits, cfg: TrainConfig, *, out: Path, log: Callable[[str], None], dist: Dist
) -> DataSplits:
    """The check's second half, once the data is split: a held-out split's leaks (and the lines), then
    ``--dedup-eval``: the evaluation images with a copy in training left out of ``data.val`` (the report says how
    many). Returns the data (its evaluation split smaller with ``--dedup-eval``)."""
    if check is None:
        return data
    if check.held_out:
        if data.train.files is None or data.val.files is None:
            return data
        check = check.with_roles(train=data.train.files, evaluation=data.val.files)
        _say(check, cfg, out=out, log=log, dist=dist)
    if not cfg.dedup_eval:
        return data
    leaked = check.leaked()
    files = data.val.files or []
    keep = np.array([k for k, f in enumerate(files) if f not in leaked], dtype=np.int64)
    gone = len(files) - len(keep)
    if gone == 0:
        log("data check: --dedup-eval: no evaluation image is also in training; the evaluation split is whole")
        return data
    if len(keep) == 0:
        raise DataError(
            f"data check: every one of the {len(files):,} evaluation images is also in training (--dedup-eval "
            f"leaves none); list in {out / REPORT_NAME}"
        )
    log(f"data check: --dedup-eval: {gone:,} evaluation image(s) also in training left out; {len(keep):,} remain "
        f"in {data.val_name}")  # fmt: skip
    if dist.is_main:
        _write(check, out / REPORT_NAME, dedup={"left_out": gone, "remaining": len(keep)})
    return dataclasses.replace(data, val=data.val.subset(keep))
