"""Export a ViT for deployment: ONNX (run it with onnxruntime) or TorchScript, with a dynamic batch size.

This writes and checks ONE model file; :mod:`vitlab.deploy` builds on it the deployable folder (the file,
its preprocessing config, int8 and token-merging variants, and the agreement report of ``vitlab export``).

Both formats take ``pixel_values`` ``(batch, C, H, W)`` at the model's resolution,
already normalised with the config's ``mean``/``std``, and return ``logits``
``(batch, num_classes)``. :func:`export_model` checks the exported program
against the PyTorch model on a batch size other than the one traced, so a
batch dimension frozen by mistake is caught at export time, not in production.

    from vitlab.export import export_model
    export_model(model, "vit.onnx", format="onnx")
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ._fs import output_error, refuse_folder, staging
from .errors import VitlabError

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

FORMATS = ("onnx", "torchscript")
_SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}
ONNX_SINGLE_FILE_BYTES = 2**31 - 2**27
"""Weights up to this many bytes go inside the ``.onnx`` file (protobuf caps a message at 2 GiB; the rest
is left for the graph); larger models keep them in ``<file>.data`` beside it, named in :attr:`ExportResult.files`."""


class ExportError(VitlabError, RuntimeError):
    """An export that failed, a missing optional dependency, or a parity check that did not pass."""


@dataclass
class ExportResult:
    path: Path
    format: str
    max_abs_diff: float | None
    """Largest |exported - PyTorch| logit difference on the check batch (None: not checked)."""
    seconds: float
    files: list[Path] = field(default_factory=list)
    """Every file written: the model file, and its external weights (``model.onnx.data``) past 2 GiB."""


class _Logits(nn.Module):
    """``forward(pixel_values) -> logits`` only: exporters want a plain tensor-in, tensor-out module."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values)


def _example(model: nn.Module, batch_size: int) -> torch.Tensor:
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise ExportError("export: the model has no vitlab config (build it with vitlab.create_model or vitlab.load)")
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch_size, cfg.in_chans, *cfg.img_size, generator=g)


def export_path(path: str | Path, *, format: str) -> Path:
    """The file an export to ``path`` writes: ``path`` itself, or ``model.onnx`` / ``model.pt`` in the
    folder ``path``."""
    if format not in FORMATS:
        raise ExportError(f"--format: {format!r} is not one of {', '.join(FORMATS)}")
    path = Path(path)
    return path / f"model{_SUFFIX[format]}" if path.is_dir() else path


def export_model(
    model: nn.Module,
    path: str | Path,
    *,
    format: str = "onnx",
    check: bool = True,
    tolerance: float = 1e-4,
    opset: int = 18,
    overwrite: bool = False,
) -> ExportResult:
    """Write ``model`` to ``path`` as ONNX (torch.export + onnxscript, opset ``opset``) or
    TorchScript (``torch.jit.trace``), batch dimension dynamic. With ``check``, run the
    exported model on a batch of 3 (traced with 2) and raise :class:`ExportError` if a
    logit differs from PyTorch's by more than ``tolerance``. An existing file is refused
    unless ``overwrite``."""
    path = export_path(path, format=format)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise ExportError(f"{path}: already exists; pass overwrite=True (--overwrite) to replace it")
    refuse_folder(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e, what="the export") from None
    wrapped = _Logits(model).eval()
    x = _example(model, 2)
    t0 = time.perf_counter()
    # Written under its own name in a fresh folder beside it, then renamed over its entry (and its .data): a link
    # at ``path`` is replaced, never written through, and a full disk leaves no truncated file behind.
    with torch.no_grad(), staging(path.parent, what="the export", shown=path) as stage:
        staged = stage / path.name
        if format == "onnx":
            try:
                import onnxscript  # noqa: F401  (the exporter needs it; fail with a clear message)
            except ImportError as e:
                raise ExportError("--format onnx needs onnx and onnxscript: pip install 'vitlab[onnx]'") from e
            batch = torch.export.Dim("batch", min=1, max=65536)
            external = _param_bytes(model) > ONNX_SINGLE_FILE_BYTES
            program = torch.onnx.export(
                wrapped,
                (x,),
                None,
                dynamo=True,
                input_names=["pixel_values"],
                output_names=["logits"],
                dynamic_shapes={"pixel_values": {0: batch}},
                opset_version=opset,
                verbose=False,
            )
            for node in program.model.graph.all_nodes():  # the exporter's debug notes: this machine's source
                node.metadata_props.clear()  # paths and stack traces in every node (half a small model's file)
            program.save(str(staged), external_data=external)
            files = [path, *([Path(f"{path}.data")] if external else [])]
        else:
            with quiet_torchscript():
                traced = torch.jit.trace(wrapped, (x,), check_trace=False)
                traced.save(str(staged))
            files = [path]
    seconds = time.perf_counter() - t0
    diff = None
    if check:
        x3 = _example(model, 3)
        with torch.inference_mode():
            want = wrapped(x3).float().numpy()
        with quiet_torchscript():  # the file this call just wrote
            got = run_exported(load_exported(path, format=format), x3.numpy())
        diff = float(np.abs(got - want).max())
        if not diff <= tolerance:
            raise ExportError(
                f"export: the {format} model differs from PyTorch by {diff:.2e} (> {tolerance:.0e}) on a batch of 3"
            )
    return ExportResult(path=path, format=format, max_abs_diff=diff, seconds=seconds, files=files)


def _param_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


@contextlib.contextmanager
def quiet_torchscript() -> Iterator[None]:
    """vitlab's own ``torch.jit.trace`` / ``load`` calls without torch's deprecation notices and tracer
    warnings: the trace is checked against the eager model right after, and the format is chosen by the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.jit")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def load_exported(path: str | Path, *, format: str | None = None, trust_torchscript: bool = False) -> Any:
    """An onnxruntime ``InferenceSession`` (CPU) for an ``.onnx`` file; a ``torch.jit.ScriptModule`` only when
    asked by name: ``format="torchscript"`` or ``trust_torchscript=True``. Loading TorchScript runs the
    program the file holds (its code is Python-like source that ``torch.jit.load`` compiles and runs), so
    a file is never taken for TorchScript because of its name; ONNX holds a graph of operators only."""
    path = Path(path)
    if format is not None and format not in FORMATS:
        raise ExportError(f"format: {format!r} is not one of {', '.join(FORMATS)}")
    fmt = format or ("onnx" if path.suffix == ".onnx" else "torchscript" if trust_torchscript else None)
    if fmt is None:
        raise ExportError(
            f"{path}: not an .onnx file; TorchScript is loaded only when asked by name, because loading it runs "
            "the program it holds: pass format='torchscript' (or trust_torchscript=True) for a file you trust"
        )
    if fmt == "onnx":
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise ExportError("running an .onnx model needs onnxruntime: pip install 'vitlab[onnx]'") from e
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with quiet_torchscript():  # runs the file's program: reached only when asked by name, checked above (tests/
        # test_reliability_checkpoints.py::test_load_exported_runs_torchscript_only_when_asked_by_name)
        return torch.jit.load(str(path), map_location="cpu")


def run_exported(session: Any, pixel_values: np.ndarray) -> np.ndarray:
    """Logits of an exported model loaded with :func:`load_exported`."""
    if isinstance(session, torch.jit.ScriptModule):
        with torch.inference_mode():
            return session(torch.from_numpy(pixel_values)).numpy()
    return session.run(["logits"], {"pixel_values": pixel_values.astype(np.float32)})[0]
