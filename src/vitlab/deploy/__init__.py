"""Deploying on a CPU: ``vitlab export`` as a library.

:func:`export_folder` writes a model as a self-contained folder (ONNX, TorchScript or vitlab's eager model;
float32, int8 through ONNX Runtime or ``torch.ao``; with token merging or not) with its preprocessing
config, runs it beside the original on images and writes the agreement report. :func:`open_exported`
runs such a folder behind vitlab's model interface (``vitlab predict`` and ``vitlab eval`` use it)::

    from vitlab.deploy import ExportOptions, export_folder, open_exported
    report = export_folder(model, "deploy/", ExportOptions(format="onnx", int8="dynamic", check_data="photos/"))
    logits = open_exported("deploy/")(pixel_values)
"""

from .folder import ExportInfo, is_exported, preprocess_config, read_export
from .pipeline import ExportOptions, export_folder
from .report import format_report
from .runtime import ExportedModel, open_exported

__all__ = [
    "ExportInfo",
    "ExportOptions",
    "ExportedModel",
    "export_folder",
    "format_report",
    "is_exported",
    "open_exported",
    "preprocess_config",
    "read_export",
]
