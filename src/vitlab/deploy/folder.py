"""The exported folder: one model file, the ``config.json`` that says how to feed it, and the agreement
report. A folder, not a file, because a model file alone does not say how to preprocess an image: the
config carries the model's mean, std, input size, interpolation, crop fraction and class names, both as
vitlab's :class:`~vitlab.models.ViTConfig` fields and as timm's ``pretrained_cfg``.

    OUT/
      model.onnx | model.pt | model.safetensors   the model (ONNX; TorchScript; vitlab's eager model)
      config.json                                 {"format": "vitlab-export", "export": {...}, ViTConfig fields,
                                                   "pretrained_cfg": {...}}
      export_report.json                          written by ``vitlab export``: agreement, sizes, timings

The config is data: read bounded, every field checked, no path in it leaves the folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._fs import atomic_write_text
from .._version import __version__
from ..checkpoints.files import read_config_file
from ..errors import CheckpointError, ConfigError
from ..models.config import ViTConfig
from ..models.timm_api import pretrained_cfg

__all__ = [
    "CONFIG_NAME",
    "FORMAT_TAG",
    "INT8_MODES",
    "MODEL_FILES",
    "OUR_FILES",
    "REPORT_NAME",
    "ExportInfo",
    "is_exported",
    "preprocess_config",
    "read_export",
    "write_config",
]

CONFIG_NAME = "config.json"
REPORT_NAME = "export_report.json"
FORMAT_TAG = "vitlab-export"
MODEL_FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "torch": "model.safetensors"}
"""The model file of each format, always this name in the folder."""
OUR_FILES = (*MODEL_FILES.values(), "model.onnx.data", CONFIG_NAME, REPORT_NAME)
"""Every file an export writes: the only ones ``--overwrite`` replaces."""
INT8_MODES = {"onnx": (None, "dynamic", "static"), "torchscript": (None, "dynamic"), "torch": (None, "dynamic")}
QUANT_FORMATS = ("qdq", "qoperator")


@dataclass
class ExportInfo:
    """What ``config.json``'s ``export`` entry states about the model file."""

    format: str
    int8: str | None = None
    """``dynamic`` (weights int8, activations quantised per batch) or ``static`` (calibrated), or None."""
    quant_format: str | None = None
    """ONNX static int8: ``qdq`` (QuantizeLinear/DequantizeLinear pairs) or ``qoperator`` (QLinear ops)."""
    tome_r: int = 0
    """Token merging: patch tokens merged per block, fixed in the graph (:mod:`vitlab.models.tome`)."""
    external_data: bool = False
    """ONNX weights in ``model.onnx.data`` beside the file (only past protobuf's 2 GiB)."""
    opset: int | None = None
    source: str | None = None
    """The ``--model`` the export was made from."""

    @property
    def file(self) -> str:
        return MODEL_FILES[self.format]

    def describe(self) -> str:
        """``onnx, int8 static (qdq), ToMe r=8`` ..."""
        parts = [self.format]
        if self.int8:
            parts.append(f"int8 {self.int8}" + (f" ({self.quant_format})" if self.quant_format else ""))
        if self.tome_r:
            parts.append(f"ToMe r={self.tome_r}")
        return ", ".join(parts)

    def validate(self, where: str) -> None:
        def bad(field: str, msg: str) -> None:
            raise CheckpointError(f"{where}: export.{field}: {msg}")

        if self.format not in MODEL_FILES:
            bad("format", f"{self.format!r} is not one of {', '.join(MODEL_FILES)}")
        if self.int8 not in INT8_MODES[self.format]:
            bad("int8", f"{self.int8!r} is not one of {INT8_MODES[self.format]} for {self.format}")
        if self.quant_format not in (None, *QUANT_FORMATS):
            bad("quant_format", f"{self.quant_format!r} is not one of {', '.join(QUANT_FORMATS)}")
        if isinstance(self.tome_r, bool) or not isinstance(self.tome_r, int) or not 0 <= self.tome_r < 2**31:
            bad("tome_r", f"expected a count >= 0, got {self.tome_r!r}")
        if not isinstance(self.external_data, bool):
            bad("external_data", f"expected true or false, got {self.external_data!r}")
        if self.opset is not None and (isinstance(self.opset, bool) or not isinstance(self.opset, int)):
            bad("opset", f"expected an integer, got {self.opset!r}")
        if self.source is not None and not isinstance(self.source, str):
            bad("source", f"expected a string, got {self.source!r}")


def preprocess_config(cfg: ViTConfig) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` for ``cfg``: what ``timm.data.resolve_data_config`` reads (the preprocessing keys
    of the model's own :func:`~vitlab.models.timm_api.pretrained_cfg`, as JSON)."""
    timm_cfg = pretrained_cfg(cfg)
    return {
        "input_size": list(timm_cfg["input_size"]),
        "mean": list(cfg.mean),
        "std": list(cfg.std),
        "interpolation": timm_cfg["interpolation"],
        "crop_pct": timm_cfg["crop_pct"],
        "crop_mode": timm_cfg["crop_mode"],
        "num_classes": cfg.num_classes,
        "label_names": list(cfg.class_names) if cfg.class_names else None,
    }


def write_config(folder: Path, cfg: ViTConfig, info: ExportInfo) -> Path:
    """``folder/config.json`` for a model of config ``cfg`` exported as ``info`` says."""
    body = {
        "format": FORMAT_TAG,
        "vitlab_version": __version__,
        "export": asdict(info),
        **cfg.to_dict(),
        "pretrained_cfg": preprocess_config(cfg),
    }
    path = folder / CONFIG_NAME
    atomic_write_text(path, json.dumps(body, indent=2) + "\n")  # (a link there is replaced, never written through)
    return path


def is_exported(path: str | os.PathLike[str]) -> bool:
    """A folder holding an export's ``config.json`` (format ``vitlab-export``)."""
    p = Path(path)
    if not (p.is_dir() and (p / CONFIG_NAME).is_file()):
        return False
    try:
        return read_config_file(p / CONFIG_NAME).get("format") == FORMAT_TAG
    except CheckpointError:
        return False


def read_export(folder: str | os.PathLike[str]) -> tuple[ViTConfig, ExportInfo]:
    """The model config and the export entry of an exported folder, every field checked; the model file
    must be there (its name is fixed by the format, never taken from the file)."""
    p = Path(folder)
    where = str(p / CONFIG_NAME)
    raw = read_config_file(p / CONFIG_NAME)
    if raw.get("format") != FORMAT_TAG:
        raise CheckpointError(f"{where}: not an exported folder's config (format {raw.get('format')!r})")
    entry = raw.get("export")
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: export: expected an object")
    known = ExportInfo.__dataclass_fields__
    unknown = sorted(set(entry) - set(known))
    if unknown or "format" not in entry:
        raise CheckpointError(f"{where}: export: unknown or missing fields ({', '.join(unknown) or 'format'})")
    info = ExportInfo(**entry)
    info.validate(where)
    fields = {k: v for k, v in raw.items() if k not in ("format", "vitlab_version", "export", "pretrained_cfg")}
    try:
        cfg = ViTConfig.from_dict(fields)
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    missing = [n for n in (info.file, *(["model.onnx.data"] if info.external_data else [])) if not (p / n).is_file()]
    if missing:
        raise CheckpointError(f"{p}: the exported folder lacks {', '.join(missing)} (copy the whole folder)")
    return cfg, info
