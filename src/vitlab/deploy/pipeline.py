"""``vitlab export`` as a function: a float32 model -> an exported folder (:mod:`.folder`) and its agreement
report (:mod:`.report`), checked on images before anything is trusted.

The folder records what runs, read from what was written: the graph's own opset, the token-merging schedule the
model applies (``--tome 100`` on a model that can merge 8 tokens a block records 8), the content hash of each
model file. An int8 export whose report measures it slower than its float32 model at a batch size keeps both
and says which serves which batch (:func:`.report.serving_table`)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._fs import atomic_write_text, output_error, staging
from .._version import __version__
from ..errors import ConfigError, OutputError
from ..evaluate.calibration import bake_temperature, model_temperature
from ..models.tome import check as tome_check
from .agreement import agreement, logits_of, serving_table, timings
from .check_images import CheckImages, folder_images, generated_images
from .folder import (
    CONFIG_NAME,
    FLOAT_FILES,
    INT8_MODES,
    OUR_FILES,
    QUANT_FORMATS,
    REPORT_NAME,
    ExportInfo,
    hashed_files,
    is_exported,
    write_config,
)
from .graph import check_opset, file_digest, read_graph
from .model_file import check_finite, export_model
from .runtime import open_exported, save_torch

__all__ = ["ExportOptions", "export_folder"]


@dataclass
class ExportOptions:
    """Everything ``vitlab export`` can be asked, with its defaults."""

    format: str = "onnx"
    int8: str | None = None
    quant_format: str = "qdq"
    tome: int = 0
    calib_data: str | None = None
    calib_limit: int = 256
    check_data: str | None = None
    check_limit: int = 500
    max_disagreement: float = 0.01
    timing_runs: int = 10
    """Batch-1 runs per model for the latency (batch 32: a quarter of them); 0: no timing."""
    opset: int = 18
    tolerance: float = 1e-4
    parity_check: bool = True
    """Check the float graph against PyTorch on a batch before quantising (max |diff| <= tolerance)."""
    overwrite: bool = False
    max_image_pixels: int | None = None

    def validate(self) -> None:
        if self.format not in INT8_MODES:
            raise ConfigError(f"--format: {self.format!r} is not one of {', '.join(INT8_MODES)}")
        if self.int8 not in INT8_MODES[self.format]:
            raise ConfigError(
                f"--int8 {self.int8}: not available for --format {self.format} (ONNX Runtime's: --format onnx)"
            )
        if self.quant_format not in QUANT_FORMATS:
            raise ConfigError(f"--quant-format: {self.quant_format!r} is not one of {', '.join(QUANT_FORMATS)}")
        if self.int8 == "static" and not self.calib_data:
            raise ConfigError("--int8 static: needs --calib-data DIR (a few hundred images like the ones it will see)")
        if self.calib_data and self.int8 != "static":
            raise ConfigError("--calib-data: only static int8 calibrates (--int8 static)")
        if not 0.0 <= self.max_disagreement <= 1.0:
            raise ConfigError(f"--max-disagreement: {self.max_disagreement} is not a fraction in [0, 1] (e.g. 1%)")
        for flag, v in (("--check-limit", self.check_limit), ("--calib-limit", self.calib_limit)):
            if v < 1:
                raise ConfigError(f"{flag}: must be >= 1, got {v}")
        if self.timing_runs < 0:
            raise ConfigError(f"--timing-runs: must be >= 0, got {self.timing_runs}")
        if self.format == "onnx":
            check_opset(self.opset)


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that is a file, holds another program's ``config.json`` (a vitlab model folder: its
    config would be replaced), or holds an export already (unless ``overwrite``)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; an export is a folder (the model file, config.json, report)")
    if (out / CONFIG_NAME).exists() and not is_exported(out):
        raise ConfigError(f"--out {out}: holds a config.json that is not an export's (a model folder?); choose another")
    if is_exported(out):
        if not overwrite:
            raise ConfigError(f"--out {out}: already holds an export; pass --overwrite to replace it")
        return
    held = [n for n in OUR_FILES if (out / n).exists()]
    if held:
        raise ConfigError(f"--out {out}: holds {', '.join(held)}, not from an export (no config.json); choose another")


def _images(model: nn.Module, opts: ExportOptions) -> tuple[CheckImages, CheckImages | None]:
    px = opts.max_image_pixels
    check = (
        folder_images(model, opts.check_data, limit=opts.check_limit, flag="--check-data", max_pixels=px)
        if opts.check_data
        else generated_images(model)
    )
    calib = None
    if opts.int8 == "static":
        calib = folder_images(model, opts.calib_data, limit=opts.calib_limit, flag="--calib-data", max_pixels=px)
    return check, calib


def effective_tome(model: nn.Module, r: int) -> tuple[int, list[int]]:
    """``(r, schedule)`` of what ``--tome r`` makes ``model`` merge: the tokens merged in each block, and the
    smallest ``r`` with that schedule (the first block's count: ``--tome 100`` on 16 patch tokens merges 8, then
    4, then none, which is ``--tome 8``); ``(0, [])`` when nothing merges."""
    if not r:
        return 0, []
    schedule = model.tome_schedule(r=r)
    first = schedule[0] if schedule else 0
    return first, schedule if first else []


def _write_model(
    model: nn.Module, stage: Path, opts: ExportOptions, calib: CheckImages | None, *, r: int, keep_float: bool
) -> ExportInfo:
    """The model file(s) in ``stage`` (with ``keep_float``, an int8 export's float32 model too, as
    :data:`FLOAT_FILES` names it); returns what was exported."""
    from .quantize import ort_dynamic, ort_static, torch_dynamic

    t = model_temperature(model)
    deployed = bake_temperature(model, t).set_tome(r).eval()  # (a copy) its logits divided by T: calibrated
    info = ExportInfo(format=opts.format, int8=opts.int8, tome_r=r, temperature=t if t != 1.0 else None)
    float_name = FLOAT_FILES[opts.format]
    if opts.format == "onnx":
        plain = stage / ("model.onnx" if opts.int8 is None else "float.onnx")
        res = export_model(
            deployed, plain, format="onnx", check=opts.parity_check, tolerance=opts.tolerance, opset=opts.opset
        )
        info.external_data = len(res.files) > 1 and opts.int8 is None
        if opts.int8 == "dynamic":
            ort_dynamic(plain, stage / "model.onnx")
        elif opts.int8 == "static":
            info.quant_format = opts.quant_format
            ort_static(plain, stage / "model.onnx", calib.inputs.numpy(), quant_format=opts.quant_format)
        if opts.int8 is not None:
            if keep_float and len(res.files) == 1:  # (a graph with external weights names its .data file)
                os.replace(plain, stage / float_name)
            else:
                for f in res.files:
                    f.unlink()
        info.opset = read_graph(stage / "model.onnx").opset  # the graph's own, not the one asked for
    else:
        quantised = torch_dynamic(deployed) if opts.int8 == "dynamic" else deployed
        if opts.format == "torchscript":
            export_model(
                quantised, stage / "model.pt", format="torchscript", check=opts.parity_check, tolerance=opts.tolerance
            )
            if opts.int8 and keep_float:
                export_model(deployed, stage / float_name, format="torchscript", check=False)
        else:
            save_torch(quantised, stage / "model.safetensors", int8=opts.int8 is not None)
            if opts.int8 and keep_float:
                save_torch(deployed, stage / float_name, int8=False)
    names = [n for n in (info.file, float_name) if (stage / n).is_file()]
    info.sha256 = {n: file_digest(hashed_files(stage, n)) for n in names}
    return info


def _clear_earlier(stage: Path, out: Path) -> list[str]:
    """Before the staged files are moved into ``out``: earlier export files there that this export does not write
    are removed (they are vitlab's own: the folder's config says it is an export; a link is removed as a link).
    Returns the staged file names."""
    names = sorted(p.name for p in stage.iterdir())
    if is_exported(out):
        for n in OUR_FILES:  # (the earlier report too: it describes the model replaced now)
            if n not in names:
                (out / n).unlink(missing_ok=True)
    return names


def export_folder(
    model: nn.Module, out: str | os.PathLike[str], opts: ExportOptions, *, source: str | None = None, command: str = ""
) -> dict[str, Any]:
    """Export the float32 ``model`` to the folder ``out`` as ``opts`` asks, then run the exported model beside
    ``model`` on the check images and write ``out/export_report.json``. Returns the report; ``passed`` is
    False when the top-1 disagreement exceeds ``opts.max_disagreement`` (the folder is kept, to look at)."""
    from ..accel import accelerate

    opts.validate()
    out = Path(out)
    check_out(out, opts.overwrite)
    check_finite(model, where=f"--model {source}" if source else "export")  # before any work
    tome_check(model, opts.tome)  # a model that cannot merge tokens fails before any work
    r, schedule = effective_tome(model, opts.tome)
    check, calib = _images(model, opts)
    made = not out.exists()
    keep_float = bool(opts.int8) and opts.timing_runs > 0
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Every file is written in a fresh folder beside its entry and renamed over it (:func:`vitlab._fs.staging`):
        # a link in ``out`` is replaced, never written through; a failure leaves the earlier export as it was.
        with staging(out, what="the export") as stage:
            info = _write_model(model, stage, opts, calib, r=r, keep_float=keep_float)
            info.source = source
            info.tome_schedule = schedule or None
            write_config(stage, model.config, info)
            files = _clear_earlier(stage, out)
    except OSError as e:
        if isinstance(e, OutputError):
            raise
        raise output_error(out, e, what="the export", kept="nothing was written") from None
    finally:
        if made and out.is_dir() and not any(out.iterdir()):  # a failed export leaves no empty folder it made
            out.rmdir()
    exported = open_exported(out, trust_torchscript=True)  # (written by this process a moment ago)
    reference = accelerate(copy.deepcopy(model)).eval()
    names = list(model.config.class_names or [str(i) for i in range(model.config.num_classes)])
    ag = agreement(logits_of(reference, check.inputs), logits_of(exported, check.inputs), check, names,
                   temperature=model_temperature(model))  # fmt: skip
    model_bytes = sum((out / f).stat().st_size for f in files if f.startswith("model."))
    rep: dict[str, Any] = {
        "command": command,
        "model": source,
        "out": str(out),
        "export": info.describe(),
        "format": info.format,
        "int8": info.int8,
        "quant_format": info.quant_format,
        "tome_r": info.tome_r,
        "opset": info.opset,
        "files": [*files, REPORT_NAME],
        "check_data": {"source": check.source, "images": len(check.names), "description": check.describe()},
        "calib_data": None if calib is None else {"source": calib.source, "images": len(calib.names)},
        "size_bytes": {"fp32": _float_bytes(model), "exported": model_bytes},
        "max_disagreement": opts.max_disagreement,
        "vitlab_version": __version__,
    }
    if (
        calib is not None
        and check.source != "generated"
        and Path(calib.source).resolve() == Path(check.source).resolve()
    ):
        rep["calib_data"]["note"] = "calibrated on the check images: the agreement is optimistic"
    if opts.tome:
        rep["tome"] = {
            "asked": opts.tome,
            "r": r,
            "schedule": model.tome_schedule(r=r) if r else [0] * len(model.blocks),
            "macs_fp32": model.macs(),
            "macs_tome": model.tome_macs(r=r),
        }
    float_name = info.float_file if (out / info.float_file).is_file() and info.int8 else None
    if opts.timing_runs:
        timed = {"fp32": reference, "exported": exported}
        if float_name:
            timed["exported_fp32"] = open_exported(out, trust_torchscript=True, only="float32")
        rep["timing"] = timings(timed, (model.config.in_chans, *model.config.img_size), runs=opts.timing_runs)
    else:
        rep["timing"] = None
    if float_name:
        info.by_batch = serving_table(rep["timing"])
        if not info.serves_float:  # int8 serves every batch: the float32 model is not kept
            (out / float_name).unlink()
            info.by_batch = None
            info.sha256.pop(float_name, None)
            rep["files"].remove(float_name)
        else:
            rep["size_bytes"]["exported_fp32"] = (out / float_name).stat().st_size
        write_config(out, model.config, info)
    rep["serving"] = {"by_batch": info.by_batch or [[1, "int8" if info.int8 else "float32"]]}
    rep["passed"] = 1.0 - ag["top1_agreement"] <= opts.max_disagreement + 1e-12
    rep["agreement"] = ag  # (last in the file: it holds the per-image predictions)
    atomic_write_text(out / REPORT_NAME, _json(rep), what="the report")
    return rep


def _float_bytes(model: nn.Module) -> int:
    """Bytes of the float32 weights (what ``model.safetensors`` holds, less its small header)."""
    return sum(t.numel() * 4 for t in model.state_dict().values() if isinstance(t, torch.Tensor))


def _json(obj: Any) -> str:
    import json

    def default(o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(type(o).__name__)

    return json.dumps(obj, indent=2, default=default) + "\n"
