"""The data check a run on a folder starts with (:mod:`vitlab.data.check`): every file read once for its content
hash and perceptual fingerprint (kept in the decode cache's folder, so a second run reads only what changed), one line
per kind of finding, the report in ``OUT/data_check.json``, and the run goes on; ``--strict-data`` stops on leaks and
conflicting labels, ``--dedup-eval`` leaves the leaked evaluation images out of the evaluation.

A folder with its own evaluation split (``train/`` + ``val/``) is checked before it is decoded, and its lines are the
run's first. A class tree whose evaluation split the run holds out is checked before too, but its leaks (images on
both sides of the split) are known once the split is made: its lines follow the decoding. Built-in data sets are not
checked (they are what they are); tar shards are not either (one line says so: check the folder they came from)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..._fs import atomic_write_text
from ...data.cache.store import default_cache_dir
from ...data.check import REPORT_NAME, DataCheck, check_folder
from ...data.shards.source import is_shard_spec
from ...data.sources import DataError, DataSplits, data_folder
from ...distributed import Dist
from ..conf.train_config import TrainConfig

__all__ = ["REPORT_NAME", "check_after", "check_before"]

SHARDS_LINE = "data check: tar shards are not checked (vitlab data check DIR checks the folder they were packed from)"


def check_before(cfg: TrainConfig, *, out: Path, log: Callable[[str], None], dist: Dist) -> DataCheck | None:
    """The check of ``cfg.data`` before it is decoded (None for data that is no folder). A folder with its own
    evaluation split: its lines now, and ``--strict-data`` refuses here. Only rank 0 checks, unless the run
    changes its evaluation split by it (``--dedup-eval``: every rank must leave out the same images; the others
    then read the hashes rank 0 kept)."""
    if is_shard_spec(cfg.data):
        log(SHARDS_LINE)
        return None
    root = data_folder(cfg.data)
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
