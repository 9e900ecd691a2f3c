"""vitlab's own format: a folder with ``model.safetensors`` and ``config.json``.

safetensors holds tensors only, so loading a folder can never run code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .._fs import default_file_mode, replacing
from .._version import __version__
from ..errors import CheckpointError, ConfigError
from ..evaluate.calibration import TEMPERATURE_KEY, checked_temperature
from ..models.config import ViTConfig
from .files import read_config_file

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "config_from_record", "config_record", "is_native", "load_folder", "save"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
FORMAT_TAG = "vitlab"
_FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".npz", ".onnx")


def is_native(path: str | os.PathLike[str]) -> bool:
    """A folder holding vitlab's ``config.json`` and ``model.safetensors``. A ``config.json`` that is
    not a small regular JSON file is not vitlab's (:func:`load_folder` says why)."""
    p = Path(path)
    if not (p.is_dir() and (p / WEIGHTS_NAME).is_file() and (p / CONFIG_NAME).is_file()):
        return False
    try:
        return read_config_file(p / CONFIG_NAME).get("format") == FORMAT_TAG
    except CheckpointError:
        return False


def save(
    model: nn.Module, path: str | os.PathLike[str], *, extra: dict[str, Any] | None = None, overwrite: bool = False
) -> Path:
    """Write ``model`` as ``path/model.safetensors`` + ``path/config.json``.

    ``path`` is a folder; a name ending in a file extension (``m.safetensors``) is refused, not made
    into a folder of that name: the weights alone would lose the configuration (class names,
    preprocessing) that :func:`~vitlab.load` needs.

    A folder that already holds a model is refused unless ``overwrite`` (as git refuses to clobber
    work without ``--force``); even then a ``config.json`` vitlab did not write (another program's
    model) is never replaced. Files are written to temporary names unique to this writer and
    renamed over their entries (:func:`vitlab._fs.replacing`), so a crash never leaves a half-written
    model behind, two writers never write into each other's files, and a link named
    ``model.safetensors`` or ``config.json`` is replaced, never written through.
    """
    cfg: ViTConfig = getattr(model, "config", None)  # type: ignore[assignment]
    if not isinstance(cfg, ViTConfig):
        raise CheckpointError(f"cannot save a {type(model).__name__}: it has no vitlab ViTConfig")
    if extra:
        cfg = cfg.replace(extra={**cfg.extra, **extra})
    out = Path(path)
    if out.suffix.lower() in _FILE_SUFFIXES and not out.is_dir():  # a file name: refuse rather than make a folder of it
        onnx = "; an ONNX file is written by vitlab export (--out m.onnx)" if out.suffix.lower() == ".onnx" else ""
        raise CheckpointError(
            f"{out}: names a file, but a model is saved as a folder (model.safetensors + config.json, as "
            f"save_pretrained does); pass the folder, e.g. {str(out.with_suffix(''))!r}{onnx}"
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: is a file, not a folder; a model is saved as a folder")
    held = [n for n in (WEIGHTS_NAME, CONFIG_NAME) if (out / n).exists() or (out / n).is_symlink()]
    if held and not overwrite:
        raise CheckpointError(f"{out}: already holds a model ({', '.join(held)}); pass overwrite=True to replace it")
    if CONFIG_NAME in held and not (out / CONFIG_NAME).is_symlink() and not _ours(out / CONFIG_NAME):
        raise CheckpointError(  # (another program's model: overwrite replaces only what vitlab wrote)
            f"{out}: holds a {CONFIG_NAME} vitlab did not write (another program's model?); overwrite replaces only "
            "vitlab's own model files: choose another folder"
        )
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    meta = config_record(cfg, architecture=type(model).__name__)
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Both files through temporary names renamed over their entries (a link there is replaced, never written
        # through); the weights are renamed first, the config last: a folder with vitlab's config is complete.
        with replacing(out / CONFIG_NAME, durable=True) as tmp_c, replacing(out / WEIGHTS_NAME, durable=True) as tmp_w:
            save_file(state, str(tmp_w), metadata={"format": "pt"})
            os.chmod(tmp_w, default_file_mode())  # safetensors creates it private (0600); a model is shared
            tmp_c.write_text(json.dumps(meta, indent=2) + "\n")
    except OSError as e:  # full disk, quota, read-only: the partial files are removed, the previous model kept
        raise CheckpointError(
            f"{out}: cannot write the model ({e.strerror or e}); the previous files there are kept"
        ) from None
    return out


def _ours(config: Path) -> bool:
    """Whether ``config`` is a ``config.json`` vitlab wrote (format ``vitlab``)."""
    try:
        return read_config_file(config).get("format") == FORMAT_TAG
    except CheckpointError:
        return False


def config_record(cfg: ViTConfig, *, architecture: str) -> dict[str, Any]:
    """What vitlab stores as a model's configuration (``config.json``, an ``.npz``'s ``vitlab/config``)."""
    return {"format": FORMAT_TAG, "architecture": architecture, **cfg.to_dict(), "vitlab_version": __version__}


def config_from_record(raw: dict[str, Any], *, where: str) -> ViTConfig:
    """The configuration :func:`config_record` wrote, every field type- and range-checked; a bad one is
    a :class:`CheckpointError` naming ``where`` and the field. Fields this version does not know are kept in
    ``extra`` (as Hugging Face keeps a config's unknown attributes); written by a newer vitlab, they may change
    what the model computes, so they are named in a warning (an older vitlab's, fields since retired, are not)."""
    fields = {k: v for k, v in raw.items() if k not in ("format", "architecture", "vitlab_version")}
    try:
        cfg = ViTConfig.from_dict(fields)
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    _warn_if_newer(raw, where=where)
    return _checked_temperature(cfg, where=where)


def _release(version: object) -> tuple[int, ...] | None:
    """``0.2.0`` as ``(0, 2, 0)``; None for anything that is not dotted whole numbers (a development tag too)."""
    parts = str(version).split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def _warn_if_newer(raw: dict[str, Any], *, where: str) -> None:
    known = {f.name for f in dataclasses.fields(ViTConfig)} | {"format", "architecture", "vitlab_version"}
    unknown = sorted(k for k in raw if k not in known)
    wrote, here = _release(raw.get("vitlab_version")), _release(__version__)
    if unknown and wrote is not None and here is not None and wrote > here:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        names = ", ".join(repr(k)[:40] for k in unknown[:5]) + more
        warnings.warn(
            f"{where}: written by vitlab {raw['vitlab_version']}, whose field(s) {names} this vitlab {__version__} "
            "does not know: kept in config.extra, not used by the model (upgrade vitlab to use them)",
            stacklevel=3,
        )


def _checked_temperature(cfg: ViTConfig, *, where: str) -> ViTConfig:
    """``cfg`` with its ``extra["temperature"]`` (the calibration a run fitted: :mod:`vitlab.evaluate.calibration`)
    kept only when it is a finite positive number; another value is data that cannot be a temperature: dropped, with
    a warning, and the model's probabilities are its plain softmax (``T = 1``). ``null``: none was fitted."""
    if TEMPERATURE_KEY not in cfg.extra:
        return cfg
    value = cfg.extra[TEMPERATURE_KEY]
    if value is None or checked_temperature(value) is not None:
        return cfg
    warnings.warn(
        f"{where}: temperature {str(value)[:40]!r} is not a finite positive number; ignored (the model's probabilities "
        "are uncalibrated, T = 1)",
        stacklevel=3,
    )
    return cfg.replace(extra={k: v for k, v in cfg.extra.items() if k != TEMPERATURE_KEY})


def load_folder(path: str | os.PathLike[str]) -> tuple[ViTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """Read a vitlab folder: ``(config, state_dict, raw config dict)``.

    The config is read only if it is a small regular file (:func:`.files.read_config_file`) and
    every field is type- and range-checked (a bad one is one line naming the file and the field)
    before the weights are read."""
    p = Path(path)
    raw = read_config_file(p / CONFIG_NAME)
    cfg = config_from_record(raw, where=str(p / CONFIG_NAME))
    try:
        state = load_file(str(p / WEIGHTS_NAME))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{p / WEIGHTS_NAME}: not a readable safetensors file ({e})") from None
    return cfg, state, raw
