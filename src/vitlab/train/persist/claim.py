"""The claim of a run folder by a new run (``--overwrite``), and what "vitlab wrote" means there.

``--overwrite`` removes only what vitlab wrote (git's rule for what it did not create): each name a run writes
(:data:`~.outputs.RUN_OUTPUTS`) is recognised by its content before anything is removed:

- ``summary.json``, ``metrics.jsonl``, ``config.yaml``, ``sizing.json``, ``scalars.csv``, ``scalars_config.json``,
  ``bad_files.txt``, ``data_check.json``: the shape vitlab writes them in (a summary's keys, a metrics row,
  ``config.yaml``'s header, the ``step,...`` header, a JSON object, ``path<TAB>reason`` lines, the data check's
  first key);
- ``last.pt``: a ``torch.save`` archive whose record holds vitlab's checkpoint keys;
- ``curves.png``, ``confusion.png``, ``health.png``, ``reliability.png``: PNG files drawn by vitlab (matplotlib's,
  or tagged vitlab);
- ``model/``: only vitlab's ``model.safetensors`` and ``config.json`` (format ``vitlab``) in it, and the folder
  when nothing else is left; ``sharded/``: only the checkpoints vitlab marked (:func:`~.dcp.clear`);
- ``adapters/`` (``--keep-adapters``): only the ``adapter_model.safetensors`` whose metadata vitlab marked and the
  ``adapter_config.json`` beside it, and the folder when nothing else is left;
- ``tensorboard/``: only the event files vitlab's tracker wrote (their first record names vitlab's ``config``);
  ``wandb/`` and ``mlruns/`` are kept whole: the new run is a new W&B / MLflow run beside the old ones.

A name that holds what vitlab did not write (a file vitlab would replace, a file where its folder goes) stops the
claim before anything is removed, in one line naming it. A symbolic link at any of the names is removed as a link
(what it points to is never touched: nothing the user wrote is lost, and the new run would replace it anyway).
Anything else in the folder, or inside ``model/`` and ``tensorboard/``, is kept and named."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

from ...checkpoints.vitlab_folder import CONFIG_NAME, WEIGHTS_NAME, is_native
from ...errors import ConfigError
from .dcp import SHARDED_DIR, clear
from .outputs import ADAPTERS_DIR, RUN_MARKERS, RUN_OUTPUTS, is_summary

__all__ = ["claim_run_folder", "written_by_vitlab"]

_READ = 1 << 20
"""The most bytes read of a file to recognise it (a summary is ~3 KiB; a long metrics.jsonl's first line ~1 KiB)."""
KEPT_TRACKER_FOLDERS = ("wandb", "mlruns")
"""Tracker stores a new run adds a run to: ``--overwrite`` keeps what is in them."""


def _head(p: Path, n: int = _READ) -> bytes:
    with open(p, "rb") as f:
        return f.read(n)


def _json_object(p: Path) -> dict | None:
    try:
        doc = json.loads(_head(p, 8 * _READ))
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _summary(p: Path) -> bool:
    return is_summary(_json_object(p))


def _metrics(p: Path) -> bool:
    first = _head(p).split(b"\n", 1)[0].strip()
    if not first:
        return True
    try:
        row = json.loads(first)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(row, dict) and "epoch" in row


def _config_yaml(p: Path) -> bool:
    return _head(p, 64).startswith(b"# vitlab train --config")


def _scalars(p: Path) -> bool:
    head = _head(p, 64)
    return not head or head.startswith(b"step,") or head.rstrip(b"\r\n") == b"step"


def _bad_files(p: Path) -> bool:
    data = _head(p)
    lines = data.decode("utf-8", "replace").splitlines()
    if len(data) == _READ:
        lines = lines[:-1]  # (cut by the read)
    return all("\t" in line for line in lines if line)


def _data_check(p: Path) -> bool:
    """The data check's report: a JSON object whose first key is ``vitlab_data_check`` (read from its head only: a
    report of many findings is longer than a read to recognise it)."""
    return re.match(rb'\{\s*"vitlab_data_check":\s*\d+\s*,', _head(p, 64)) is not None


def _png(p: Path) -> bool:
    head = _head(p, 4096)
    return head.startswith(b"\x89PNG\r\n\x1a\n") and (b"vitlab" in head or b"Matplotlib" in head)


def _checkpoint(p: Path) -> bool:
    try:
        with zipfile.ZipFile(p) as z:
            rec = next((i for i in z.infolist() if i.filename.endswith("/data.pkl")), None)
            if rec is None or rec.file_size > 64 * _READ:
                return False
            with z.open(rec) as f:
                data = f.read(64 * _READ)
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return b"vitlab_checkpoint" in data or (b"best_top1" in data and b"loader_rng" in data)


_FILES: dict[str, Callable[[Path], bool]] = {
    "summary.json": _summary,
    "last.pt": _checkpoint,
    "metrics.jsonl": _metrics,
    "config.yaml": _config_yaml,
    "sizing.json": lambda p: (_json_object(p) or {}).get("vitlab_sizing") == 1,
    "scalars.csv": _scalars,
    "scalars_config.json": lambda p: _json_object(p) is not None,
    "bad_files.txt": _bad_files,
    "data_check.json": _data_check,
    "curves.png": _png,
    "confusion.png": _png,
    "health.png": _png,
    "reliability.png": _png,
}


def written_by_vitlab(path: Path) -> bool:
    """Whether the regular file ``path``, one of the names a run writes, holds what vitlab writes there."""
    check = _FILES.get(path.name)
    if check is None or not path.is_file() or path.is_symlink():
        return False
    try:
        return check(path)
    except OSError:
        return False


def _model_files(folder: Path) -> tuple[list[Path], list[str]]:
    """``(vitlab's files in model/, what there is not vitlab's and would be replaced)``."""
    ours, foreign = [], []
    if is_native(folder):
        ours = [folder / WEIGHTS_NAME, folder / CONFIG_NAME]
    else:
        foreign = [f"model/{n}" for n in (WEIGHTS_NAME, CONFIG_NAME) if (folder / n).exists()]
    ours += [p for p in folder.glob(".*.tmp*") if p.is_file()]  # left by a save that was killed
    return ours, foreign


_ADAPTER_WEIGHTS, _ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
_ADAPTER_MARK = b'"vitlab":"lora-adapters"'


def _adapter_files(folder: Path) -> tuple[list[Path], list[str]]:
    """``(vitlab's files in adapters/, what there is not vitlab's and would be replaced)``: the weights are vitlab's
    when their safetensors header (its first bytes, bounded) holds vitlab's metadata mark, and the config beside
    them with them."""
    weights, config = folder / _ADAPTER_WEIGHTS, folder / _ADAPTER_CONFIG
    ours = False
    if weights.is_file() and not weights.is_symlink():
        try:
            head = _head(weights, 8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            ours = 0 < n <= 64 * _READ and _ADAPTER_MARK in _head(weights, 8 + n)[8:].replace(b" ", b"")
        except OSError:
            ours = False
    present = [p for p in (weights, config) if p.exists() or p.is_symlink()]
    if ours:
        return present, []
    return [], [f"{ADAPTERS_DIR}/{p.name}" for p in present]


def _tensorboard_files(folder: Path) -> list[Path]:
    """The event files vitlab's TensorBoard tracker wrote in ``folder`` (it logs the run's ``config`` first)."""
    found = []
    for p in folder.glob("events.out.tfevents.*"):
        try:
            if p.is_file() and not p.is_symlink() and b"config/text_summary" in _head(p):
                found.append(p)
        except OSError:
            continue
    return found


def _overwrite_targets(out: Path) -> tuple[list[Path], list[str]]:
    """``(what --overwrite removes, what vitlab did not write and would replace)`` among the run's names."""
    remove, foreign = [], []
    for name in RUN_OUTPUTS:
        p = out / name
        if name == SHARDED_DIR or (name in KEPT_TRACKER_FOLDERS and p.is_dir() and not p.is_symlink()):
            continue
        if p.is_symlink():
            remove.append(p)
        elif not p.exists():
            continue
        elif name in ("model", ADAPTERS_DIR):  # folders of vitlab's files: each file told apart by its content
            if not p.is_dir():
                foreign.append(name)
                continue
            ours, theirs = (_model_files if name == "model" else _adapter_files)(p)
            remove += ours
            foreign += theirs
        elif name == "tensorboard":
            if not p.is_dir():
                foreign.append(name)
                continue
            remove += _tensorboard_files(p)
        elif name in KEPT_TRACKER_FOLDERS:
            foreign.append(name)  # a file where the tracker writes its folder
        elif written_by_vitlab(p):
            remove.append(p)
        else:
            foreign.append(name + ("/" if p.is_dir() else ""))
    return remove, foreign


def claim_run_folder(out: Path, *, overwrite: bool, init: str | None, log: Callable[[str], None]) -> None:
    """Make ``out`` ready for a new run (not a resumed one); the caller holds its lock.

    A folder that holds another run (:data:`~.outputs.RUN_MARKERS`: finished, stopped or foreign) is refused
    in one line, unless ``overwrite``: then the previous run's outputs that vitlab wrote (see the module's
    notes) are removed before the new run writes anything, so that the folder holds only the new run. What
    vitlab did not write is never removed: a name the new run would replace that holds something else stops
    the claim, before anything is removed; everything else is kept and named. An empty or new folder is fine."""
    found = [n for n in RUN_MARKERS if (out / n).exists() or (out / n).is_symlink()]
    if not found:
        return
    if not overwrite:
        raise ConfigError(
            f"{out}: holds another run ({', '.join(found)}); pass --resume to continue it, "
            "--overwrite to replace it, or choose another --out"
        )
    if init is not None and Path(init).exists() and out.resolve() in Path(init).resolve().parents:
        raise ConfigError(f"--init {init}: is inside {out}, which --overwrite would clear; copy it elsewhere first")
    remove, foreign = _overwrite_targets(out)
    if foreign:
        raise ConfigError(
            f"--overwrite: {out} holds {', '.join(foreign)}, which vitlab did not write and the new run would "
            "replace; --overwrite removes only a run's own outputs: move them away, or choose another --out"
        )
    removed = []
    for p in remove:
        p.unlink(missing_ok=True)  # (a link is removed, never what it points to)
        rel = p.relative_to(out).as_posix()
        top = rel.split("/")[0]
        if top not in removed:
            removed.append(top)
    kept: list[str] = []
    for name in ("model", "tensorboard", ADAPTERS_DIR):
        p = out / name
        if p.is_dir() and not p.is_symlink():
            try:
                p.rmdir()  # only when nothing else is in it
            except OSError:
                kept += [f"{name}/{q.name}" for q in sorted(p.iterdir())]
    sharded = out / SHARDED_DIR
    kept_sharded = []
    if sharded.exists() or sharded.is_symlink():  # only the checkpoints vitlab wrote there; a link the user made stays
        kept_sharded = clear(out)
        gone = not (sharded.exists() or sharded.is_symlink())
        removed.append(SHARDED_DIR if gone else f"checkpoints in {SHARDED_DIR}/")
    trackers = [n for n in KEPT_TRACKER_FOLDERS if (out / n).is_dir()]
    log(f"{out}: --overwrite: removed the previous run's {', '.join(removed) or 'outputs'}")
    if kept:
        log(f"{out}: kept {len(kept)} entries vitlab did not write ({', '.join(kept[:5])})")
    if trackers:
        log(f"{out}: kept {', '.join(n + '/' for n in trackers)}: the new run is logged as a new run beside the old")
    if kept_sharded:
        names = ", ".join(kept_sharded[:5])
        log(f"{out / SHARDED_DIR}: kept {len(kept_sharded)} entries vitlab did not write ({names})")
