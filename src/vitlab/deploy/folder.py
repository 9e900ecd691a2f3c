"""The exported folder: one model file, the ``config.json`` that says how to feed it, and the agreement
report. A folder, not a file, because a model file alone does not say how to preprocess an image: the
config carries the model's mean, std, input size, interpolation, crop fraction and class names, as
vitlab's :class:`~vitlab.models.ViTConfig` fields, as timm's ``pretrained_cfg``, and as the whole contract from
an image file to the model's input (``preprocessing``: EXIF orientation, transparency, resize, crop, scale).

    OUT/
      model.onnx | model.pt | model.safetensors   the model (ONNX; TorchScript; vitlab's eager model)
      model-fp32.onnx | .pt | .safetensors        an int8 export's float32 graph, when the report measured it
                                                  faster at some batch size (``export.by_batch`` says which)
      config.json                                 {"format": "vitlab-export", "export": {...}, ViTConfig fields,
                                                   "pretrained_cfg": {...}, "preprocessing": {...}}
      export_report.json                          written by ``vitlab export``: agreement, sizes, timings

The config holds what inference needs only: no training record (data paths, epochs, recipe) and no
training-only field (dropout, stochastic depth, patch dropout). It is data: read bounded, every field checked
for its type and range (sizes, opset, token merging, mean/std, crop, classes; against the graph's own shapes
when the folder is opened), no path in it leaves the folder.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._fs import atomic_write_text
from .._version import __version__
from ..checkpoints.files import read_config_file
from ..data.pipeline.transforms import resize_side
from ..errors import CheckpointError, ConfigError
from ..evaluate.calibration import checked_temperature
from ..models.config import ViTConfig
from ..models.timm_api import pretrained_cfg
from ..models.tome import merge_schedule
from .graph import MIN_OPSET, max_opset

__all__ = [
    "CONFIG_NAME",
    "FLOAT_FILES",
    "FORMAT_TAG",
    "INT8_MODES",
    "MAX_CLASSES",
    "MAX_SIDE",
    "MODEL_FILES",
    "OUR_FILES",
    "REPORT_NAME",
    "ExportInfo",
    "check_inference_config",
    "exported_config",
    "hashed_files",
    "inference_config",
    "is_exported",
    "preprocess_config",
    "preprocessing_contract",
    "read_export",
    "write_config",
]

CONFIG_NAME = "config.json"
REPORT_NAME = "export_report.json"
FORMAT_TAG = "vitlab-export"
MODEL_FILES = {"onnx": "model.onnx", "torchscript": "model.pt", "torch": "model.safetensors"}
"""The model file of each format, always this name in the folder."""
FLOAT_FILES = {"onnx": "model-fp32.onnx", "torchscript": "model-fp32.pt", "torch": "model-fp32.safetensors"}
"""An int8 export's float32 model, kept when its report measured it faster at some batch size."""
OUR_FILES = (*MODEL_FILES.values(), *FLOAT_FILES.values(), "model.onnx.data", CONFIG_NAME, REPORT_NAME)
"""Every file an export writes: the only ones ``--overwrite`` replaces."""
INT8_MODES = {"onnx": (None, "dynamic", "static"), "torchscript": (None, "dynamic"), "torch": (None, "dynamic")}
QUANT_FORMATS = ("qdq", "qoperator")
GRAPHS = ("int8", "float32")
MAX_SIDE = 4096
"""The largest input side (and resize side, ``img_size / crop_pct``) an exported folder may state: a 4096 px
ViT already has 65,536 patch tokens at patch 16; a config saying 60000 would have ``predict`` resize every
image to 60000x60000 (43 GB) before the graph refuses it."""
MAX_CLASSES = 1 << 20
"""The most classes an exported folder may state (ImageNet-21k has 21,843): ``predict`` names every one."""
MAX_CHANNELS = 64
MAX_NAME_CHARS = 1000
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
KEPT_EXTRA = ("hf_hub_id", "license", "tag")
"""Of a model's ``extra``, what an export keeps: where a public checkpoint came from and its licence."""
TRAINING_ONLY = ("drop_rate", "attn_drop_rate", "drop_path_rate", "patch_drop_rate")
""":class:`ViTConfig` fields that act in training only (dropout, stochastic depth, patch dropout): not written."""


@dataclass
class ExportInfo:
    """What ``config.json``'s ``export`` entry states about the model file."""

    format: str
    int8: str | None = None
    """``dynamic`` (weights int8, activations quantised per batch) or ``static`` (calibrated), or None."""
    quant_format: str | None = None
    """ONNX static int8: ``qdq`` (QuantizeLinear/DequantizeLinear pairs) or ``qoperator`` (QLinear ops)."""
    tome_r: int = 0
    """Token merging: patch tokens merged per block, fixed in the graph (:mod:`vitlab.models.tome`): the
    effective count, the first block's (``--tome 100`` on a model of 16 patch tokens records 8)."""
    tome_schedule: list[int] | None = None
    """Token merging: the tokens merged in each block, as the graph merges them."""
    external_data: bool = False
    """ONNX weights in ``model.onnx.data`` beside the file (only past protobuf's 2 GiB)."""
    opset: int | None = None
    """ONNX: the opset of the graph, read from the file written."""
    source: str | None = None
    """The ``--model`` the export was made from."""
    sha256: dict[str, str] | None = None
    """Content hash of each model file as the export wrote it (``{"model.onnx": "sha256:..."}``): a graph whose
    hash differs (or a folder without one) was not written by vitlab as it is, and runs under a time limit."""
    by_batch: list[list[Any]] | None = None
    """int8 only: ``[[first batch size, "int8" | "float32"], ...]``, which model serves a batch of each size, from
    the report's measurement (the float32 one is :data:`FLOAT_FILES`); None: the int8 model for every batch."""
    temperature: float | None = None
    """The model's calibration temperature, baked into the model file: its ``logits`` output is the model's logits
    divided by it, so their softmax is the calibrated probabilities (:mod:`vitlab.evaluate.calibration`); vitlab's
    runtime multiplies them back (:class:`~vitlab.deploy.runtime.ExportedModel`). None: the model had none (T = 1)."""

    @property
    def file(self) -> str:
        return MODEL_FILES[self.format]

    @property
    def float_file(self) -> str:
        return FLOAT_FILES[self.format]

    @property
    def serves_float(self) -> bool:
        """An int8 export that serves some batch sizes with its float32 model (:attr:`by_batch`)."""
        return bool(self.int8) and any(kind == "float32" for _, kind in self.by_batch or [])

    def files(self) -> list[str]:
        """The model files the folder holds for this export."""
        out = [self.file, *(["model.onnx.data"] if self.external_data else [])]
        return out + ([self.float_file] if self.serves_float else [])

    def graph_for(self, batch: int) -> str:
        """``int8`` or ``float32``: the model that serves a batch of ``batch`` images."""
        if not self.int8:
            return "float32"
        return [kind for first, kind in self.by_batch or [[1, "int8"]] if first <= batch][-1]

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
        if not _count(self.tome_r):
            bad("tome_r", f"expected a count >= 0, got {self.tome_r!r}")
        if self.tome_schedule is not None and (
            not isinstance(self.tome_schedule, list) or not all(_count(k) for k in self.tome_schedule)
        ):
            bad("tome_schedule", f"expected a list of counts, got {self.tome_schedule!r}")
        if not isinstance(self.external_data, bool):
            bad("external_data", f"expected true or false, got {self.external_data!r}")
        if self.external_data and self.format != "onnx":
            bad("external_data", "only an ONNX graph keeps its weights beside it")
        if self.opset is not None and (isinstance(self.opset, bool) or not isinstance(self.opset, int)):
            bad("opset", f"expected an integer, got {self.opset!r}")
        if self.opset is not None and self.format != "onnx":
            bad("opset", f"an opset belongs to an ONNX graph, not to {self.format}")
        if self.opset is not None and not MIN_OPSET <= self.opset <= max_opset():
            bad("opset", f"{self.opset} is not one of {MIN_OPSET}..{max_opset()} (the ONNX opsets of a ViT)")
        if self.source is not None and not isinstance(self.source, str):
            bad("source", f"expected a string, got {self.source!r}")
        if self.sha256 is not None:
            known = {*MODEL_FILES.values(), *FLOAT_FILES.values(), "model.onnx.data"}
            if not isinstance(self.sha256, dict) or not all(
                k in known and isinstance(v, str) and _DIGEST.fullmatch(v) for k, v in self.sha256.items()
            ):
                bad("sha256", "expected {model file: 'sha256:<64 hex digits>'}")
        if self.by_batch is not None:
            table = self.by_batch
            ok = (
                isinstance(table, list)
                and 0 < len(table) <= 8
                and all(
                    isinstance(e, list) and len(e) == 2 and _count(e[0]) and e[0] >= 1 and e[1] in GRAPHS for e in table
                )
            )
            if not ok or table[0][0] != 1 or any(a[0] >= b[0] for a, b in itertools.pairwise(table)):
                bad("by_batch", "expected [[1, 'int8' | 'float32'], [first batch size, ...], ...] in rising order")
            if not self.int8:
                bad("by_batch", "only an int8 export chooses between its int8 and float32 models")


def hashed_files(folder: Path, name: str) -> list[Path]:
    """The files the content hash of the model file ``name`` covers: the file, and ``model.onnx.data`` after
    ``model.onnx`` when the graph keeps its weights there."""
    data = folder / f"{name}.data"
    return [folder / name, *([data] if name == "model.onnx" and data.is_file() else [])]


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


def check_inference_config(cfg: ViTConfig, info: ExportInfo, where: str) -> None:
    """The ranges of an exported folder's config beyond :class:`ViTConfig`'s own checks: what ``predict`` would
    allocate or print from it (input and resize sides, classes, channels, names), what normalises (mean, std) and
    the token-merging record against the model it describes. A one-line :class:`CheckpointError` naming the
    field."""

    def bad(field: str, msg: str) -> None:
        raise CheckpointError(f"{where}: {field}: {msg}")

    h, w = cfg.img_size
    if max(h, w) > MAX_SIDE:
        bad("img_size", f"{h}x{w} is larger than an exported model's input may be ({MAX_SIDE} px a side)")
    if max(resize_side(h, cfg.crop_pct), resize_side(w, cfg.crop_pct)) > MAX_SIDE:
        bad("crop_pct", f"{cfg.crop_pct} would resize images to over {MAX_SIDE} px a side before the crop")
    if not 1 <= cfg.num_classes <= MAX_CLASSES:
        bad("num_classes", f"{cfg.num_classes} is not in 1..{MAX_CLASSES:,}")
    if cfg.in_chans > MAX_CHANNELS:
        bad("in_chans", f"{cfg.in_chans} is more than {MAX_CHANNELS} channels")
    if cfg.class_names is not None:
        if not all(isinstance(n, str) for n in cfg.class_names):
            bad("class_names", "expected a list of strings")
        long = [n for n in cfg.class_names if len(n) > MAX_NAME_CHARS]
        if long:
            bad("class_names", f"a name of {len(long[0]):,} characters (at most {MAX_NAME_CHARS})")
    for field, values, low, high in (("mean", cfg.mean, -100.0, 100.0), ("std", cfg.std, 1e-4, 100.0)):
        if not all(low <= v <= high for v in values):
            bad(field, f"{list(values)} is outside [{low:g}, {high:g}] (images are scaled to [0, 1] first)")
    depth, patches = cfg.depth, cfg.num_patches
    if info.tome_r:
        if info.tome_r > patches // 2:
            bad("export.tome_r", f"{info.tome_r} tokens merged per block; the model has {patches} patch tokens")
        want = merge_schedule(patches, depth, info.tome_r)
        if info.tome_schedule is not None and info.tome_schedule != want:
            bad("export.tome_schedule", f"{info.tome_schedule} is not the schedule of r={info.tome_r} ({want})")
    elif info.tome_schedule not in (None, [0] * depth, []):
        bad("export.tome_schedule", f"{info.tome_schedule} with tome_r 0")


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


def preprocessing_contract(cfg: ViTConfig) -> dict[str, Any]:
    """The whole way from an image file to the model's input, as ``vitlab predict`` and ``vitlab eval`` go it
    (:func:`vitlab.data.images.decode.decode_image`, then :func:`vitlab.data.eval_transform`): what a server needs to
    give the exported model the pixels vitlab gives it (``docs/deploy.md`` has one that reads this entry)."""
    h, w = cfg.img_size
    square = h == w
    c = cfg.in_chans
    return {
        "exif_orientation": "applied (the image turned as its EXIF orientation tag says: ImageOps.exif_transpose)",
        "transparency": "composited on white (palette, LA, RGBA and PA images), then RGB",
        "high_bit_depth": "16-bit and float greyscale scaled to 8 bits (not clipped)",
        "mode": "L" if c == 1 else "RGB",
        "mode_rule": "RGB; a one-channel model takes its ITU-R 601-2 luma (PIL convert('L')), a grey image is "
        "repeated to RGB",
        "resize": (
            {"shorter_side": resize_side(h, cfg.crop_pct), "longer_side": "floor(shorter_side * longer / shorter)"}
            if square
            else {"size": [resize_side(h, cfg.crop_pct), resize_side(w, cfg.crop_pct)]}
        ),
        "interpolation": "bicubic, PIL's Image.resize on the 8-bit image (no resize when the size is already right)",
        "center_crop": [h, w],
        "crop_offset": "round((side - crop) / 2), rounding halves to even (torchvision's CenterCrop)",
        "scale": "pixel / 255 as float32",
        "mean": list(cfg.mean)[:c] + [cfg.mean[-1]] * max(0, c - len(cfg.mean)),
        "std": list(cfg.std)[:c] + [cfg.std[-1]] * max(0, c - len(cfg.std)),
        "normalize": "(x - mean) / std per channel",
        "input": {"name": "pixel_values", "shape": ["batch", c, h, w], "layout": "NCHW", "dtype": "float32"},
        "output": {
            "name": "logits",
            "shape": ["batch", cfg.num_classes],
            "note": "no softmax applied; the model's logits divided by export.temperature when it has one (baked in): "
            "softmax(logits) is then the calibrated probabilities, logits * temperature the model's own",
        },
    }


def inference_config(cfg: ViTConfig) -> dict[str, Any]:
    """``cfg`` as an exported folder's ``config.json`` holds it: every field inference reads, no training-only
    field (:data:`TRAINING_ONLY`: 0 when read back) and, of ``extra``, only the licence and Hub id of a public
    checkpoint (no data path, epoch, recipe or accuracy of the run that trained it)."""
    body = cfg.to_dict()
    for name in TRAINING_ONLY:
        body.pop(name, None)
    body["extra"] = {k: v for k, v in cfg.extra.items() if k in KEPT_EXTRA and isinstance(v, str)}
    return body


def write_config(folder: Path, cfg: ViTConfig, info: ExportInfo) -> Path:
    """``folder/config.json`` for a model of config ``cfg`` exported as ``info`` says."""
    body = {
        "format": FORMAT_TAG,
        "vitlab_version": __version__,
        "export": asdict(info),
        **inference_config(cfg),
        "pretrained_cfg": preprocess_config(cfg),
        "preprocessing": preprocessing_contract(cfg),
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


def exported_config(folder: str | os.PathLike[str]) -> ViTConfig:
    """The model config an exported folder states (:func:`read_export`'s, every field checked), without opening its
    model: what a command that plans from a model's shape reads (``vitlab plan --model DIR``)."""
    return read_export(folder)[0]


def read_export(folder: str | os.PathLike[str]) -> tuple[ViTConfig, ExportInfo]:
    """The model config and the export entry of an exported folder, every field checked (types, ranges:
    :func:`check_inference_config`); the model files must be there (their names are fixed by the format, never
    taken from the file). Reads the config only: :func:`vitlab.deploy.open_exported` opens the folder."""
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
    if info.temperature is not None and checked_temperature(info.temperature) is None:
        warnings.warn(
            f"{where}: export.temperature {str(info.temperature)[:40]!r} is not a finite positive number; ignored "
            "(the graph's logits are served as they are)",
            stacklevel=2,
        )
        info.temperature = None
    elif info.temperature is not None:
        info.temperature = float(info.temperature)
    info.validate(where)
    skip = ("format", "vitlab_version", "export", "pretrained_cfg", "preprocessing")
    fields = {k: v for k, v in raw.items() if k not in skip}
    try:
        cfg = ViTConfig.from_dict(fields)
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None
    check_inference_config(cfg, info, where)
    missing = [n for n in info.files() if not (p / n).is_file()]
    if missing:
        raise CheckpointError(f"{p}: the exported folder lacks {', '.join(missing)} (copy the whole folder)")
    return cfg, info
