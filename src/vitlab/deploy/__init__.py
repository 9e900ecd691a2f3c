"""Deploying on a CPU: ``vitlab export`` as a library.

:func:`export_folder` writes a model as a self-contained folder (ONNX, TorchScript or vitlab's eager model;
float32, or int8 through ONNX Runtime or vitlab's own int8 layer; with token merging or not) with its preprocessing
config, runs it beside the original on images and writes the agreement report. :func:`open_exported`, the one
way vitlab opens an export, runs such a folder behind vitlab's model interface (``vitlab predict`` and ``vitlab
eval`` use it). :func:`export_model` writes one model file alone (``vitlab export --out vit.onnx``;
:mod:`.model_file`, also importable as ``vitlab.export``) and :func:`load_exported` runs such a file::

    from vitlab.deploy import ExportOptions, export_folder, open_exported
    report = export_folder(model, "deploy/", ExportOptions(format="onnx", int8="dynamic", check_data="photos/val"))
    logits = open_exported("deploy/")(pixel_values)
"""

from .agreement import format_report
from .folder import (
    ExportInfo,
    exported_config,
    is_exported,
    preprocess_config,
    preprocessing_contract,
    read_export,
)
from .graph import ExportError
from .model_file import ExportResult, export_model, load_exported, run_exported
from .pipeline import ExportOptions, export_folder
from .runtime import ExportedModel, open_exported

__all__ = [
    "ExportError",
    "ExportInfo",
    "ExportOptions",
    "ExportResult",
    "ExportedModel",
    "export_folder",
    "export_model",
    "exported_config",
    "format_report",
    "is_exported",
    "load_exported",
    "open_exported",
    "preprocess_config",
    "preprocessing_contract",
    "read_export",
    "run_exported",
]
