"""One model file for deployment: ONNX (run it with onnxruntime) or TorchScript, with a dynamic batch size.

This writes and checks ONE model file (``vitlab export --out vit.onnx``); the rest of :mod:`vitlab.deploy` builds on
it the deployable folder (the file, its preprocessing config, int8 and token-merging variants, and the agreement
report of ``vitlab export``). ``vitlab.export`` names the same functions (it was this module's place before).

Both formats take ``pixel_values`` ``(batch, C, H, W)`` at the model's resolution,
already normalised with the config's ``mean``/``std``, and return ``logits``
``(batch, num_classes)``. :func:`export_model` checks the exported program
against the PyTorch model on a batch size other than the one traced, so a
batch dimension frozen by mistake is caught at export time, not in production.

    from vitlab.deploy import export_model
    export_model(model, "vit.onnx", format="onnx")
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .._fs import output_error, refuse_folder, staging
from .graph import ExportError, check_opset, open_session, read_graph, run_seconds

__all__ = [
    "FORMATS",
    "ONNX_SINGLE_FILE_BYTES",
    "ExportError",
    "ExportResult",
    "check_finite",
    "export_model",
    "export_path",
    "load_exported",
    "quiet_torchscript",
    "run_exported",
]

FORMATS = ("onnx", "torchscript")
_MACS_PER_PIXEL = 350_000
"""About ViT-B/16's multiply-accumulates per input pixel (17.6 G at 224 px): the time limit of a lone ``.onnx``
file, whose size no config states."""
_SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}
ONNX_SINGLE_FILE_BYTES = 2**31 - 2**27
"""Weights up to this many bytes go inside the ``.onnx`` file (protobuf caps a message at 2 GiB; the rest
is left for the graph); larger models keep them in ``<file>.data`` beside it, named in :attr:`ExportResult.files`."""


@dataclass
class ExportResult:
    path: Path
    format: str
    max_abs_diff: float | None
    """Largest |exported - PyTorch| logit difference on the check batch (None: not checked)."""
    seconds: float
    files: list[Path] = field(default_factory=list)
    """Every file written: the model file, and its external weights (``model.onnx.data``) past 2 GiB."""
    opset: int | None = None
    """ONNX: the opset of the graph written (read from the file, not the one asked for)."""


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


def check_finite(model: nn.Module, *, where: str = "export") -> None:
    """A one-line :class:`ExportError` when a weight or buffer of ``model`` holds NaN or infinity: such a model
    answers NaN for every image, and an export of it would be written, checked (NaN == NaN fails no parity test
    that compares with ``<=``) and served."""
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ExportError(f"{where}: the model's {name} holds {bad:,} NaN or infinite values; it cannot predict")


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
    unless ``overwrite``. A model with non-finite weights, an opset outside what the exporter
    writes, or a graph written at another opset than ``opset`` is refused in one line."""
    path = export_path(path, format=format)
    if format == "onnx":
        check_opset(opset)
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise ExportError(f"{path}: already exists; pass overwrite=True (--overwrite) to replace it")
    check_finite(model)
    refuse_folder(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e, what="the export") from None
    wrapped = _Logits(model).eval()
    x = _example(model, 2)
    t0 = time.perf_counter()
    written = None
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
            with _quiet_converter():
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
            written = read_graph(staged).opset
            if written != opset:
                raise ExportError(
                    f"--opset {opset}: the exporter could not write this model at opset {opset} (it wrote "
                    f"{written}); export at {written} or later"
                )
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
            runner = open_session(path) if format == "onnx" else load_exported(path, format=format)
            got = run_exported(runner, x3.numpy())
        diff = float(np.abs(got - want).max())
        if not diff <= tolerance:
            raise ExportError(
                f"export: the {format} model differs from PyTorch by {diff:.2e} (> {tolerance:.0e}) on a batch of 3"
            )
    return ExportResult(path=path, format=format, max_abs_diff=diff, seconds=seconds, files=files, opset=written)


@contextlib.contextmanager
def _quiet_converter() -> Iterator[None]:
    """Without onnxscript's version-converter log (a warning and a C++ assertion's traceback when an opset cannot
    be reached: the graph's own opset, read back, says so in one line) and torch's note on the opset it uses."""
    logs = [logging.getLogger(n) for n in ("onnxscript", "torch.onnx._internal.exporter._compat")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


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
    """A single exported file, ready to run with :func:`run_exported`: for an ``.onnx`` file a
    :class:`~vitlab.deploy.graph.GraphSession` (onnxruntime on the CPU, the graph checked first and, having no
    folder that records its content hash, run under a time limit: :mod:`vitlab.deploy.graph`); a
    ``torch.jit.ScriptModule`` only when asked by name: ``format="torchscript"`` or ``trust_torchscript=True``.
    Loading TorchScript runs the program the file holds (its code is Python-like source that ``torch.jit.load``
    compiles and runs), so a file is never taken for TorchScript because of its name; ONNX holds a graph of
    operators only. An exported folder opens with :func:`vitlab.deploy.open_exported`."""
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
        facts = read_graph(path)
        _, _, h, w = facts.input_shape
        macs = _MACS_PER_PIXEL * (h or 224) * (w or 224)  # (no config says the model's size: ViT-B/16's per pixel)
        return open_session(path, facts=facts, limit=lambda batch: run_seconds(macs, batch))
    with quiet_torchscript():  # runs the file's program: reached only when asked by name, checked above (tests/
        # test_reliability_checkpoints.py::test_load_exported_runs_torchscript_only_when_asked_by_name)
        return torch.jit.load(str(path), map_location="cpu")


def run_exported(session: Any, pixel_values: np.ndarray) -> np.ndarray:
    """Logits of an exported model loaded with :func:`load_exported`."""
    if isinstance(session, torch.jit.ScriptModule):
        with torch.inference_mode():
            return session(torch.from_numpy(pixel_values)).numpy()
    if hasattr(session, "logits"):
        return session.logits(pixel_values)
    return session.run(["logits"], {"pixel_values": pixel_values.astype(np.float32)})[0]
