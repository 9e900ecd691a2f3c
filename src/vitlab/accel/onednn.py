"""Fused linear layers for CPU inference, through oneDNN.

An eager ``nn.Linear`` on the CPU runs MKL's sgemm on the weight as stored, after copying the
broadcast bias into the output, and every activation and residual add that follows is a
separate pass over memory. oneDNN can run the same product on a weight re-laid out once for its
kernels ("packed", what inductor's freezing does) and apply the bias, a GELU or a residual add
in the GEMM's epilogue, while the tile is still in cache. :func:`block_forward` runs a whole
encoder block (Eq. 2-3) that way. The results differ from ``F.linear`` by float32 rounding only
(summation order).

The path is taken only where it is exact in meaning: gradient-free, float32, CPU, eval mode
(no dropout), not under autocast, tracing, export or ``torch.compile`` (which does its own
fusion). The packed weight is cached per layer and rebuilt when the weight changes: a new
tensor, an in-place write that bumps its version counter (``load_state_dict``, ``copy_``), or
one that does not (PyTorch's fused AdamW writes in place without bumping it): a sample of
256 weights is compared exactly on every call, and an optimizer step changes them all. An
edit that bumps no version and misses the sample (a fused kernel writing a few weights)
needs :func:`clear_cache`. The cache costs one extra copy of the linear weights while the
model lives.

    with vitlab.accel.onednn.disabled():   # the plain aten path, e.g. to compare
        logits = model(images)
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn

from ..models.layers import Block
from .switch import Switch, running_eagerly

__all__ = [
    "applies",
    "available",
    "block_forward",
    "clear_cache",
    "disabled",
    "eager_cpu_inference",
    "forget",
    "linear",
    "pack",
    "packed_product",
]

_SAMPLE = 256
_packed: weakref.WeakKeyDictionary[nn.Linear, tuple[tuple[int, int, torch.Size], torch.Tensor, torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def available() -> bool:
    """Whether this torch build has oneDNN's fused linear ops (x86 and ARM CPU builds do)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (out, in) re-laid out once for oneDNN's GEMM kernels."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with a weight from :func:`pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


_switch = Switch()
disabled = _switch.disabled
"""Run the plain aten path inside the block (benchmarks, debugging); process-wide."""


def eager_cpu_inference(x: torch.Tensor) -> bool:
    """A gradient-free forward of ``x`` on the CPU, run eagerly: not traced, exported or compiled,
    which record one graph for every batch size and fuse on their own. The condition both CPU
    inference measures share: these fused linears and the batch chunks of
    ``VisionTransformer.inference_chunk_size``."""
    return not torch.is_grad_enabled() and x.device.type == "cpu" and running_eagerly()


def applies(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` (in eval mode) may compute on ``x`` with the fused oneDNN linears."""
    return (
        _switch.on
        and not module.training
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and eager_cpu_inference(x)
        and available()
    )


def _epilogue(act: nn.Module | None) -> tuple[str, str] | None:
    """oneDNN's name for ``act`` (attr, algorithm), or None when it has none."""
    if act is None:
        return ("none", "")
    if type(act) is nn.GELU:
        return ("gelu", act.approximate)  # "none" = exact erf GELU, "tanh" = the approximation
    if type(act) is nn.ReLU:
        return ("relu", "")
    return None


def clear_cache() -> None:
    """Forget every packed weight (they are rebuilt on the next call)."""
    _packed.clear()


def forget(module: nn.Module) -> None:
    """Drop the packed weights of ``module``'s linear layers (a block entering training: the
    first optimizer step makes them stale, and they would only hold memory meanwhile)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            _packed.pop(m, None)


def _sample(w: torch.Tensor) -> torch.Tensor:
    return w.detach().reshape(-1)[:: max(1, w.numel() // _SAMPLE)]


def _packed_weight(lin: nn.Linear) -> torch.Tensor:
    w = lin.weight
    # Inference tensors (a model built under inference_mode) keep no version counter.
    key = (w.data_ptr(), -1 if w.is_inference() else w._version, w.shape)
    hit = _packed.get(lin)
    if hit is None or hit[0] != key or not torch.equal(hit[2], _sample(w)):
        hit = (key, pack(w), _sample(w).clone())
        _packed[lin] = hit
    return hit[1]


def linear(
    lin: nn.Linear, x: torch.Tensor, *, act: nn.Module | None = None, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """``act(lin(x))``, or ``lin(x) + residual``, in one fused oneDNN call.

    Callers check :func:`applies` first. An activation oneDNN does not know is applied
    after the product; ``act`` and ``residual`` are not combined.
    """
    if act is not None and residual is not None:
        raise ValueError("linear: fuse an activation or a residual, not both")
    w = _packed_weight(lin)
    if residual is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, w, lin.bias, "add")
    fused = _epilogue(act)
    if fused is None:
        assert act is not None
        return act(packed_product(x, w, lin.bias))
    attr, algorithm = fused
    return torch.ops.mkldnn._linear_pointwise(x, w, lin.bias, attr, [], algorithm)


def block_forward(block: Block, x: torch.Tensor) -> torch.Tensor:
    """``block(x)`` in inference (callers check :func:`applies` and the block's structure): the
    biases, the GELU and both residual adds of Eq. 2-3 ride in the GEMM epilogues."""
    attn, mlp = block.attn, block.mlp
    b, n, d = x.shape
    qkv = linear(attn.qkv, block.norm1(x)).view(b, n, 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
    x = linear(attn.proj, o, residual=x)  # Eq. 2
    return linear(mlp.fc2, linear(mlp.fc1, block.norm2(x), act=mlp.act), residual=x)  # Eq. 3
