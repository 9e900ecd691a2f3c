"""``vitlab.export``: the single-file export, now :mod:`vitlab.deploy.model_file` (the one-file half of
:mod:`vitlab.deploy`); these names stay importable from here.

    from vitlab.export import export_model
    export_model(model, "vit.onnx", format="onnx")
"""

from __future__ import annotations

from .deploy.model_file import (
    FORMATS,
    ONNX_SINGLE_FILE_BYTES,
    ExportError,
    ExportResult,
    export_model,
    export_path,
    load_exported,
    quiet_torchscript,
    run_exported,
)

__all__ = [
    "FORMATS",
    "ONNX_SINGLE_FILE_BYTES",
    "ExportError",
    "ExportResult",
    "export_model",
    "export_path",
    "load_exported",
    "quiet_torchscript",
    "run_exported",
]
