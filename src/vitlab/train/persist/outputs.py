"""A run's folder and what it writes there besides checkpoints: ``metrics.jsonl`` (one line per epoch),
``summary.json``, ``config.yaml`` (what re-creates the run); every write replaces its entry, never follows a link
(:mod:`vitlab._fs`). The claim of the folder by a new run is :mod:`.claim`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._fs import append_text, atomic_write_text, read_small
from ..conf.config_file import config_text
from ..sizing.choice import SIZING_FILE, Sizing
from ..sizing.steps import RunPlan
from .advice import top1_stderr
from .position import RunPosition

if TYPE_CHECKING:
    import torch

    from ...data.sources import DataSplits
    from ...models import VisionTransformer, ViTConfig
    from ..conf.train_config import TrainConfig

__all__ = [
    "ADAPTERS_DIR",
    "RUN_MARKERS",
    "RUN_OUTPUTS",
    "append_metrics",
    "epoch_row",
    "is_summary",
    "model_epoch",
    "model_summary",
    "read_metrics",
    "read_summary",
    "run_summary",
    "truncate_metrics",
    "write_config",
    "write_json",
    "write_sizing",
]

ADAPTERS_DIR = "adapters"
"""Where ``--keep-adapters`` writes LoRA's adapters alone (:func:`vitlab.adapters.peft_files.save_adapters`)."""
RUN_MARKERS = ("summary.json", "last.pt", "metrics.jsonl", "model")
"""What a run leaves in its folder: a folder holding any of them holds a run."""
RUN_OUTPUTS = (*RUN_MARKERS, "sharded", "curves.png", "confusion.png", "bad_files.txt", "config.yaml", "sizing.json",
               "health.png", "reliability.png", "scalars.csv", "scalars_config.json", "tensorboard", "wandb",
               "mlruns", "data_check.json", "adapters")  # fmt: skip
"""Everything a run writes in its folder (``.lock`` aside), the folders of the ``--log`` trackers included
(:mod:`vitlab.track.backends`): the names ``--overwrite`` looks at, removing only what vitlab wrote there
(:func:`~vitlab.train.persist.claim.claim_run_folder`)."""
SUMMARY_BYTES = 8 << 20
"""The most bytes a ``summary.json`` is read for (a run's is about 3 KiB; many classes' numbers make it longer)."""


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Atomic JSON write."""
    p = Path(path)
    atomic_write_text(p, json.dumps(obj, indent=2) + "\n")


def write_config(cfg: TrainConfig, out: Path) -> None:
    """``out/config.yaml``: what the run was asked, which ``vitlab train --config`` reads back
    (:func:`~vitlab.train.conf.config_file.config_text`); written atomically."""
    atomic_write_text(out / "config.yaml", config_text(cfg))


def write_sizing(out: Path, record: dict[str, Any]) -> None:
    """``out/sizing.json``: what the run chose (:meth:`~vitlab.train.sizing.Sizing.record`), which a run from its
    ``config.yaml`` reads back; written atomically."""
    atomic_write_text(out / SIZING_FILE, json.dumps(record, indent=1) + "\n")


def append_metrics(row: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """One line of ``metrics.jsonl``, fsynced; never through a link (:func:`~vitlab._fs.append_text`)."""
    append_text(path, json.dumps(row) + "\n")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by a kill
            break
    return rows


def read_summary(out: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``out/summary.json`` as a run wrote it when it finished (None: absent, unreadable, larger than a summary
    honestly is, or not a finished run's: an interrupted one, or another file of that name)."""
    try:
        doc = json.loads(read_small(Path(out) / "summary.json", limit=SUMMARY_BYTES, links=False))
    except (OSError, ValueError):  # (absent or unreadable; NotAFile, TooLarge, not JSON: ValueErrors)
        return None
    return doc if is_summary(doc) and not doc["interrupted"] else None


def is_summary(doc: Any) -> bool:
    """Whether a read JSON document is a ``summary.json`` as :func:`run_summary` writes it (its keys; the one rule,
    for the resume of a finished run and for ``--overwrite``'s what-vitlab-wrote check)."""
    return isinstance(doc, dict) and {"epochs", "steps", "interrupted"} <= doc.keys()


def truncate_metrics(path: str | os.PathLike[str], *, last_epoch: int) -> list[dict[str, Any]]:
    """Keep the rows of epochs ``<= last_epoch`` (those the resume checkpoint has seen)."""
    rows = [r for r in read_metrics(path) if r.get("epoch", 0) <= last_epoch]
    p = Path(path)
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def model_summary(mcfg: ViTConfig, init: str | None) -> dict[str, Any]:
    """The trained architecture as ``summary.json`` describes it."""
    return {
        "name": mcfg.name,
        "img_size": list(mcfg.img_size),
        "patch_size": mcfg.patch_size,
        "embed_dim": mcfg.embed_dim,
        "depth": mcfg.depth,
        "num_heads": mcfg.num_heads,
        "mlp_dim": mcfg.mlp_dim,
        "init": init,
    }


def model_epoch(rows: Sequence[dict[str, Any]], *, keep: str) -> dict[str, Any] | None:
    """The ``metrics.jsonl`` row of the epoch whose weights ``model/`` holds: the last one (``--keep last``), or the
    first with the highest top-1 (``--keep best``: the trainer saves on a strict improvement). None: no epoch yet."""
    if not rows:
        return None
    if keep != "best":
        return rows[-1]
    return max(rows, key=lambda r: (r["top1"], -r["epoch"]))


def run_summary(
    *,
    position: RunPosition,
    plan: RunPlan,
    cfg: TrainConfig,
    sizing: Sizing,
    model: VisionTransformer,
    data: DataSplits,
    processes: int,
    device: torch.device,
    out: Path,
    wall_s: float,
    rows: Sequence[dict[str, Any]],
    data_record: dict[str, Any] | None = None,
    model_eval: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary.json``: the accuracy of the weights ``model/`` holds (``top1``, ``top5``, measured at
    ``model_epoch``: what ``vitlab eval`` and ``confusion.png`` report for them) and their calibration (``ece`` of the
    probabilities ``vitlab predict`` gives, ``ece_uncalibrated``, the ``temperature``: on images that did not fit it,
    :func:`~vitlab.evaluate.calibration.calibrate`), the last epoch's and the best one
    (from the ``metrics.jsonl`` ``rows``), the evaluation split's size and the standard error of top-1 on it, how far
    the run got against its plan, its throughput, the model, the data (with ``data_record``: its absolute location and
    fingerprint, :func:`~vitlab.train.engine.run_data.data_record`), the recipe, and with ``model_eval`` (the weights
    ``model/`` holds) which images fitted its temperature and which measured it."""
    p = position
    kept = model_epoch(rows, keep=cfg.keep)
    best = model_epoch(rows, keep="best")
    n_eval = len(data.val)
    described = {**data.describe(), **_data_source(data_record)}
    summary = {
        "top1": kept["top1"] if kept else None,
        "top5": kept["top5"] if kept else None,
        **({"top1_native": kept["top1_native"]} if kept and "top1_native" in kept else {}),
        # the calibration of model/'s weights (fitted when they were saved; none before the feature or for MPP)
        "ece": kept.get("ece") if kept else None,
        "ece_uncalibrated": kept.get("ece_uncalibrated") if kept else None,
        "temperature": kept.get("temperature") if kept else None,
        "model_epoch": kept["epoch"] if kept else None,
        "keep": cfg.keep,
        "last_top1": rows[-1]["top1"] if rows else None,
        "last_top5": rows[-1]["top5"] if rows else None,
        "best_top1": p.best if p.best >= 0 else None,
        "best_epoch": best["epoch"] if best else None,
        "eval": {
            "split": data.val_name,
            "images": n_eval,
            "top1_stderr": round(top1_stderr(kept["top1"], n_eval), 2) if kept and n_eval else None,
        },
        "epochs": p.epoch,
        "steps": p.step,
        "images_per_sec": p.images / max(p.train_s, 1e-9),
        "wall_s": wall_s,
        "params": model.num_params(),
        "model": model_summary(model.config, cfg.init),
        "data": described,
        "recipe": sizing.recipe.name,
        "recipe_config": sizing.recipe.to_dict(),
        "recipe_chosen": sizing.chosen,
        "objective": cfg.objective,
        "processes": processes,
        "device": device.type,
        "out": str(out),
        "interrupted": p.interrupted,
        "nan_skipped": _skipped(rows, p),
        "planned_epochs": plan.epochs,
        "planned_steps": plan.total_steps,
    }
    if model_eval is not None and "calibration" in model_eval:  # which images fitted its temperature, which measured
        summary["calibration"] = model_eval["calibration"]
    return summary


def epoch_row(p: RunPosition, *, ev: dict[str, Any], lr: float, images_per_sec: float, wall_s: float) -> dict[str, Any]:
    """The epoch's line of ``metrics.jsonl``, at its end: the training loss of the steps taken, the evaluation
    ``ev``, the pace, and the skipped steps of the epoch (a resumed part's included) when there were any."""
    row = {
        "epoch": p.epoch + 1,
        "step": p.step,
        "train_loss": p.loss_sum / p.loss_count if p.loss_count else None,
        "lr": lr,
        "top1": ev["top1"],
        "top5": ev["top5"],
        "eval_loss": ev["loss"],
        "images_per_sec": images_per_sec,
        "wall_s": wall_s,
    }
    if ev.get("tta"):
        row["tta"] = ev["tta"]
    if p.skipped:
        row["nan_skipped"] = p.skipped
    return row


def _skipped(rows: Sequence[dict[str, Any]], p: RunPosition) -> int:
    """The run's skipped steps: of every process that ran it (the ``rows``, which rank 0 reads) and of the epoch in
    progress when it stopped mid-epoch."""
    done = sum(r.get("nan_skipped", 0) for r in rows if isinstance(r.get("nan_skipped"), int))
    return done + (p.skipped if p.interrupted else 0)


def _data_source(record: dict[str, Any] | None) -> dict[str, Any]:
    """``summary.json``'s ``data.path`` and ``data.fingerprint`` from what the run records of its data."""
    if not record:
        return {}
    return {"path": record.get("data"), "fingerprint": record.get("data_fingerprint")}
