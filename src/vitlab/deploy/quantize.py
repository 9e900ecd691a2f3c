"""int8 weights for CPU inference, two ways.

- **ONNX Runtime** (the ``onnx`` extra): :func:`ort_dynamic` (weights int8, each batch's activations
  quantised on the fly: no data needed) and :func:`ort_static` (activation ranges calibrated once on a few
  hundred images of the model's own preprocessing; QDQ or QOperator graph). Only the products are
  quantised (``MatMul``, ``Gemm``, the patch ``Conv``): LayerNorm, softmax, GELU and the residual adds stay
  float, which keeps the logits' cosine to the float model highest for the same speed-critical work.
  Weights per output channel.
- **PyTorch** (no extra): :func:`torch_dynamic` swaps every ``nn.Linear`` for :class:`Int8Linear`, vitlab's own
  dynamically quantised linear layer on plain torch ops: int8 weights per output channel (symmetric), each call's
  activations quantised per row (token) to int8, the products summed in int32 (``torch._int_mm``, the kernel
  torchao's ``Int8DynamicActivationInt8WeightConfig`` runs), then scaled back to float. Not ``torch.ao.quantization``,
  which PyTorch deprecated for removal (its successor, torchao, is a separate package that is not a vitlab
  dependency); the scheme is torchao's, the layer twenty lines. :func:`int8_state` / :func:`load_int8` store and
  rebuild it from plain tensors (int8 weights and their scales in safetensors): no pickle, no code in the file.
  Folders written with ``torch.ao`` (the same tensors plus all-zero zero points) load as they are.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError
from .graph import ExportError

__all__ = ["OP_TYPES", "Int8Linear", "int8_state", "load_int8", "ort_dynamic", "ort_static", "torch_dynamic"]

OP_TYPES = ["MatMul", "Gemm", "Conv"]
"""The ONNX ops quantised: the matrix products (attention's and the linear layers') and the patch projection."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without onnxruntime's per-tensor log lines (it logs on the root logger: integer shape tensors it leaves
    alone) and its quantiser's deprecation notices."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)
            yield
    finally:
        root.setLevel(level)


def _ort_quantization():
    try:
        from onnxruntime import quantization
    except ImportError as e:
        raise ExportError("--int8 with --format onnx needs onnxruntime: pip install 'vitlab[onnx]'") from e
    return quantization


def ort_dynamic(src: Path, dst: Path) -> None:
    """``src`` (float ONNX) -> ``dst`` with int8 weights and dynamically quantised activations."""
    q = _ort_quantization()
    with _quiet():
        q.quantize_dynamic(
            str(src), str(dst), weight_type=q.QuantType.QInt8, per_channel=True, op_types_to_quantize=OP_TYPES
        )


def ort_static(src: Path, dst: Path, calib: np.ndarray, *, quant_format: str = "qdq", batch: int = 16) -> None:
    """``src`` -> ``dst`` with int8 weights and activations, ranges from the calibration batch ``calib``
    ``(N, C, H, W)`` (min-max). ``quant_format``: ``qdq`` (QuantizeLinear/DequantizeLinear around float ops,
    fused by the runtime) or ``qoperator`` (QLinearMatMul ... ops, unsigned activations)."""
    q = _ort_quantization()

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.start = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.start >= len(calib):
                return None
            part = np.ascontiguousarray(calib[self.start : self.start + batch], dtype=np.float32)
            self.start += batch
            return {"pixel_values": part}

    qoperator = quant_format == "qoperator"
    with _quiet():
        pre = dst.with_name(dst.stem + "-pre.onnx")
        try:
            q.shape_inference.quant_pre_process(str(src), str(pre))
        except Exception:  # (shape inference is an optimisation; quantise the graph as exported)
            pre = src
        q.quantize_static(
            str(pre),
            str(dst),
            Reader(),
            quant_format=q.QuantFormat.QOperator if qoperator else q.QuantFormat.QDQ,
            activation_type=q.QuantType.QUInt8 if qoperator else q.QuantType.QInt8,
            weight_type=q.QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=OP_TYPES,
            calibrate_method=q.CalibrationMethod.MinMax,
        )
        if pre != src:
            pre.unlink(missing_ok=True)


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` stored as int8 per output channel (``W[o] ~ weight_scale[o] * weight[o]``,
    symmetric) and ``x`` quantised to int8 per row for each call (scale ``max|x_row| / 127``, dynamic: no
    calibration), ``x_q W_q^T`` summed in int32, then scaled back to float32. Buffers only: it is not trained."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.to(torch.int8).contiguous())
        self.register_buffer("weight_scale", weight_scale.to(torch.float32).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        """``linear``'s weights rounded to int8 per output channel."""
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
        q = (w / scale[:, None]).round().clamp(-127, 127)
        return cls(q, scale, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float()
        s = (rows.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
        q = (rows / s).round().clamp(-127, 127).to(torch.int8)
        y = self._products(q).float() * (s * self.weight_scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def _products(self, q: torch.Tensor) -> torch.Tensor:
        """``q @ weight.T`` in int32, exact on every CPU: where the int8 kernel saturates
        (:func:`int_mm_saturates`), through the weight in halves (:func:`_halves`, made at each call from the
        weight: nothing kept beside it). A trace may be served on another CPU than the one it was made on: it asks
        the kernel at each call (the same worst case: one 8 x 8 product)."""
        w = self.weight
        if w.device.type != "cpu":
            return _int8_matmul(q, w)
        if torch.jit.is_tracing():
            return _traced_products()(q, w)
        if int_mm_saturates():
            return _int8_matmul(torch.cat([q, q], dim=1), _halves(w))
        return _int8_matmul(q, w)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _int8_matmul(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``q @ w.T`` of int8 matrices, in int32 (``torch._int_mm``; where this torch lacks it for the device, the
    same sums in float64, exact for these sizes)."""
    try:
        return torch._int_mm(q, w.t())
    except (AttributeError, RuntimeError, NotImplementedError):
        return (q.double() @ w.double().t()).round().to(torch.int32)


def _saturates() -> bool:
    """The worst case, 127 x 127 summed over 8 terms, against its exact sum (TorchScript can compile it)."""
    q = torch.full([8, 8], 127, dtype=torch.int8)
    return not bool((torch._int_mm(q, q.t()) == 127 * 127 * 8).all())


@functools.cache
def int_mm_saturates() -> bool:
    """Whether ``torch._int_mm`` gets int8 sums wrong on this CPU. oneDNN's int8 kernels for x86 CPUs without
    VNNI (AVX2 only, AVX-512 before Cascade Lake, AMD before Zen 4) add each pair of products in int16 with
    saturation (``vpmaddubsw``): two products of 127 x 127 already pass 32,767. Emulated with
    ``ONEDNN_MAX_CPU_ISA=AVX2``, 127 x 127 over 64 terms summed to 8,160 instead of 1,032,256, and a tiny model's int8
    copy agreed with it on 67% of images. With every weight within [-64, 64] the sums are exact, which
    :func:`_halves` gives. Asked once a process."""
    try:
        return _saturates()
    except (AttributeError, RuntimeError, NotImplementedError):
        return False  # (no kernel: _int8_matmul's float64 sums)


def _halves(w: torch.Tensor) -> torch.Tensor:
    """``[hi, lo]`` side by side (``out x 2 in``) with ``hi + lo = w``, each within [-64, 64]: ``q @ w.T`` is
    ``[q, q] @ [hi, lo].T``, which a saturating kernel sums exactly. (``w >> 1`` is ``floor(w / 2)``.)"""
    hi = w >> 1
    return torch.cat([hi, w - hi], dim=1)


def _exact_products(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """:meth:`Int8Linear._products` in a trace: the kernel asked at each call, the halves made where needed."""
    if _saturates():
        return torch._int_mm(torch.cat([q, q], dim=1), _halves(w).t())
    return torch._int_mm(q, w.t())


@functools.cache
def _traced_products():
    """:func:`_exact_products` compiled, so that a trace keeps its branch (a trace alone records one path)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(_exact_products)


def torch_dynamic(model: nn.Module) -> nn.Module:
    """A copy of ``model`` in eval mode whose ``nn.Linear`` layers are :class:`Int8Linear` (int8 weights per
    output channel, activations quantised per row for each batch)."""
    import copy

    out = copy.deepcopy(model).eval()
    for name, m in list(out.named_modules()):
        if isinstance(m, nn.Linear):
            _replace(out, name, Int8Linear.from_float(m))
    return out


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)


def int8_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of a :func:`torch_dynamic` model: plain parameters and buffers as they are; for each
    :class:`Int8Linear` ``L``: ``L.weight`` (int8), ``L.weight_scale`` (per output channel) and ``L.bias``
    (float)."""
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def load_int8(model: nn.Module, state: dict[str, torch.Tensor], *, source: str) -> nn.Module:
    """``model`` (a float ViT of the right config) as :func:`torch_dynamic` made it, with the int8 weights
    of ``state`` (:func:`int8_state`, or the same tensors as ``torch.ao`` stored them, with zero points). Every
    tensor must fit: a missing, extra or mis-shaped one is a :class:`~vitlab.errors.CheckpointError` naming
    ``source``."""
    from ..checkpoints import load_state

    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    names = [n for n, m in linears.items() if state.get(f"{n}.weight", torch.empty(0)).dtype == torch.int8]
    prefixes = tuple(n + "." for n in names)
    load_state(model, {k: v for k, v in state.items() if not k.startswith(prefixes)}, source=source, fresh=prefixes)
    for n in names:
        w8, scale, zp = (state.get(f"{n}.{k}") for k in ("weight", "weight_scale", "weight_zero_point"))
        out_f, in_f = linears[n].out_features, linears[n].in_features
        if w8.shape != (out_f, in_f) or scale is None or scale.shape != (out_f,):
            raise CheckpointError(f"{source}: {n}: int8 weight or scales do not fit ({out_f}x{in_f})")
        if not scale.is_floating_point() or not bool(torch.isfinite(scale).all()) or bool((scale <= 0).any()):
            raise CheckpointError(f"{source}: {n}.weight_scale: expected positive finite scales")
        if zp is not None and (zp.shape != (out_f,) or bool(zp.any())):
            raise CheckpointError(f"{source}: {n}.weight_zero_point: only symmetric int8 weights (zero points 0)")
        bias = state.get(f"{n}.bias")
        if (bias is None) != (linears[n].bias is None) or (bias is not None and bias.shape != (out_f,)):
            raise CheckpointError(f"{source}: {n}.bias: missing or mis-shaped")
        extra = set(k for k in state if k.startswith(f"{n}.")) - {
            f"{n}.{k}" for k in ("weight", "weight_scale", "weight_zero_point", "bias")
        }
        if extra:
            raise CheckpointError(f"{source}: unexpected tensors {', '.join(sorted(extra))}")
        _replace(model, n, Int8Linear(w8, scale, bias))
    return model.eval()
