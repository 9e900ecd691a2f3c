"""int8 weights for CPU inference, two ways.

- **ONNX Runtime** (the ``onnx`` extra): :func:`ort_dynamic` (weights int8, each batch's activations
  quantised on the fly: no data needed) and :func:`ort_static` (activation ranges calibrated once on a few
  hundred images of the model's own preprocessing; QDQ or QOperator graph). Only the products are
  quantised (``MatMul``, ``Gemm``, the patch ``Conv``): LayerNorm, softmax, GELU and the residual adds stay
  float, which keeps the logits' cosine to the float model highest for the same speed-critical work.
  Weights per output channel.
- **PyTorch** (no extra): :func:`torch_dynamic` swaps every ``nn.Linear`` for ``torch.ao``'s dynamically
  quantised Linear (per-channel int8 weights). :func:`int8_state` / :func:`load_int8` store and rebuild
  it from plain tensors (int8 weights, scales, zero points in safetensors): no pickle, no code in the file.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..export import ExportError

__all__ = ["OP_TYPES", "int8_state", "load_int8", "ort_dynamic", "ort_static", "torch_dynamic"]

OP_TYPES = ["MatMul", "Gemm", "Conv"]
"""The ONNX ops quantised: the matrix products (attention's and the linear layers') and the patch projection."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without torch.ao's deprecation notices and onnxruntime's per-tensor log lines (it logs on the root
    logger: integer shape tensors it leaves alone)."""
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


def torch_dynamic(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` layers are ``torch.ao``'s dynamically quantised Linear
    (int8 weights per output channel, activations quantised per batch), in eval mode."""
    import copy

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with _quiet():
        return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear: per_channel_dynamic_qconfig})


def _qlinear_type() -> type:
    from torch.ao.nn.quantized.dynamic import Linear

    return Linear


def int8_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of a :func:`torch_dynamic` model: plain parameters and buffers as they are; for each
    quantised Linear ``L``: ``L.weight`` (int8), ``L.weight_scale`` and ``L.weight_zero_point`` (per output
    channel) and ``L.bias`` (float)."""
    qlinear = _qlinear_type()
    state: dict[str, torch.Tensor] = {}
    quantised = [name for name, m in model.named_modules() if isinstance(m, qlinear)]
    for name, m in model.named_modules():
        if isinstance(m, qlinear):
            w, b = m.weight(), m.bias()
            state[f"{name}.weight"] = w.int_repr().contiguous()
            state[f"{name}.weight_scale"] = w.q_per_channel_scales().double().contiguous()
            state[f"{name}.weight_zero_point"] = w.q_per_channel_zero_points().long().contiguous()
            if b is not None:
                state[f"{name}.bias"] = b.detach().float().contiguous()
        elif not any(name.startswith(q + ".") for q in quantised):
            prefix = f"{name}." if name else ""
            for k, t in (*m._parameters.items(), *m._buffers.items()):
                if t is not None and k not in m._non_persistent_buffers_set:
                    state[prefix + k] = t.detach().contiguous()
    return state


def load_int8(model: nn.Module, state: dict[str, torch.Tensor], *, source: str) -> nn.Module:
    """``model`` (a float ViT of the right config) as :func:`torch_dynamic` made it, with the int8 weights
    of ``state`` (:func:`int8_state`). Every tensor must fit: a missing, extra or mis-shaped one is a
    :class:`~vitlab.errors.CheckpointError` naming ``source``."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from ..checkpoints import load_state
    from ..errors import CheckpointError

    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    names = [n for n, m in linears.items() if state.get(f"{n}.weight", torch.empty(0)).dtype == torch.int8]
    prefixes = tuple(n + "." for n in names)
    load_state(model, {k: v for k, v in state.items() if not k.startswith(prefixes)}, source=source, fresh=prefixes)
    with _quiet():
        model = quantize_dynamic(model.eval(), {n: per_channel_dynamic_qconfig for n in names})
    for n in names:
        w8, scale, zp = (state.get(f"{n}.{k}") for k in ("weight", "weight_scale", "weight_zero_point"))
        out_f, in_f = linears[n].out_features, linears[n].in_features
        if w8.shape != (out_f, in_f) or scale is None or zp is None or scale.shape != (out_f,) or zp.shape != (out_f,):
            raise CheckpointError(f"{source}: {n}: int8 weight, scales or zero points do not fit ({out_f}x{in_f})")
        bias = state.get(f"{n}.bias")
        if (bias is None) != (linears[n].bias is None) or (bias is not None and bias.shape != (out_f,)):
            raise CheckpointError(f"{source}: {n}.bias: missing or mis-shaped")
        with _quiet():
            qw = torch._make_per_channel_quantized_tensor(w8, scale.double(), zp.long(), 0)
        model.get_submodule(n).set_weight_bias(qw, bias)
    return model
