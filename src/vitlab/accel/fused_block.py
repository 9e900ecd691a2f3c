"""One autograd node per Transformer block for CPU training.

Autograd records a ViT block (Eq. 2-3) as ~15 nodes, and three of them cost more than their
arithmetic on a CPU: the backward of ``qkv.unbind`` stacks the three attention gradients into
a new tensor, the backward of the head-split ``permute`` copies that again into the
``(tokens, 3D)`` layout the qkv GEMMs want, and each residual add and bias broadcast is a
further pass over memory. This module computes the same forward and backward by hand, in the
order autograd would, but

- feeds the three attention gradients (which the CPU flash kernel returns token-major) to the
  qkv weight and input gradients as three GEMMs each, so nothing is stacked or permuted;
- adds the residual and the bias once (``(x + b).addmm_(...)``) instead of in two passes;
- keeps only what the backward needs (as autograd does), under one node, in buffers the block
  keeps from one step to the next (:mod:`.buffers`);
- where a C compiler is at hand, runs the LayerNorms, the exact GELU and the bias sums as the
  fused kernels of :mod:`.c_kernels`, which also do the residual and bias adds around them;
- for a LoRA layer over a frozen weight (:class:`~vitlab.adapters.lora.LoRALinear`, ``vitlab finetune --lora``)
  takes the effective weight ``W + s B A`` as a constant and forms the adapters' gradients from the layer's own
  input ``X`` and output gradient ``dY`` by thin products, ``dB = s dY^T (X A^T)`` and ``dA = s (dY B)^T X``
  (``4 m d r`` multiply-adds a layer), never the full ``dY^T X`` (``m d_out d_in``) that a full fine-tune forms:
  the product autograd would chain through ``W + s B A`` instead, to float32 rounding;
- for an SSF layer over a frozen linear (:class:`~vitlab.adapters.ssf.SSF`, ``vitlab finetune --tune ssf``),
  ``y = gamma * (x W^T + b) + beta``, takes ``diag(gamma) W`` and ``gamma b + beta`` as constants and forms
  ``d beta = sum_m dY`` and ``d gamma = (sum_m dY * y - beta d beta) / gamma`` from the layer's output ``y``, which
  the node keeps anyway (the qkv output, fc1's pre-activation, and the residual stream before and after the
  projection and fc2): one pass over ``m d_out`` numbers instead of the ``m d_out d_in`` of ``dY^T X`` that autograd
  reduces to ``d gamma`` through ``diag(gamma) W``. The division is exact in meaning; in float32 it holds where
  ``|gamma|`` is not tiny (:data:`SSF_SCALE_FLOOR`: below it, that layer takes autograd's product).

Every product is the one autograd would call (MKL GEMMs, the flash attention kernel, ATen's
LayerNorm and GELU, or the C kernels' same formulas), so results agree with the plain path to
float32 rounding. It applies where it is exact in meaning: training with autograd on, float32,
CPU, no autocast, no dropout inside the block (stochastic depth is supported), attention with
a qkv bias and a GELU MLP, run eagerly. Everything else takes the plain path.

The workspace is leased to one forward at a time: a second forward before the first one's
backward (two micro-batches, one backward) gets fresh memory, and a backward through a graph
whose buffers a later forward has overwritten (``retain_graph=True``, then another forward)
fails with autograd's in-place modification error instead of returning wrong gradients. What
the block hands out (its output, and its input gradient on the C-kernel path) is never a leased
buffer (:meth:`.buffers.Workspace.returned`); every other gradient is fresh memory.

    with vitlab.accel.fused_block.disabled():   # the plain autograd path, e.g. to compare
        loss = criterion(model(images), labels)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..adapters.lora import LoRALinear
from ..adapters.ssf import SSF
from ..models.layers import Block
from . import c_kernels as native
from .buffers import Alloc, Scratch, Workspace, fresh
from .switch import Switch, running_eagerly

__all__ = ["applies", "block_forward", "disabled", "eager_cpu_training", "uses_c_kernels"]

_aten = torch.ops.aten

SSF_SCALE_FLOOR = 1e-2
"""The smallest ``|gamma|`` of an SSF layer whose scale gradient the node divides out of the layer's output (see the
module's notes); a layer with a smaller one takes autograd's product through ``diag(gamma) W``. A scale trained from
one to below this is far outside what SSF's papers report (it stays near one); the floor only keeps float32's
relative error of ``(y - beta) / gamma`` bounded."""


_switch = Switch()
disabled = _switch.disabled
"""Train through the plain autograd path (benchmarks, debugging); process-wide."""


def eager_cpu_training(x: torch.Tensor) -> bool:
    """A float32 CPU forward that autograd records, run eagerly: not under autocast, and not
    traced, exported or compiled (those record their own graph and fuse on their own)."""
    return (
        torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and running_eagerly()
    )


def applies(block: Block, x: torch.Tensor) -> bool:
    """Whether ``block``'s training forward on ``x`` may run as one fused autograd node (for a
    block whose structure the caller has checked: :func:`.switch.unchanged`)."""
    if not (_switch.on and block.training and x.ndim == 3 and eager_cpu_training(x)):
        return False
    attn, mlp = block.attn, block.mlp
    return (
        attn.qkv.bias is not None
        and attn.attn_drop == 0.0
        and attn.proj_drop.p == 0.0
        and mlp.drop1.p == 0.0
        and mlp.drop2.p == 0.0
        and type(mlp.act) is nn.GELU
        and _has_grad(block, x)
    )


def _has_grad(block: nn.Module, x: torch.Tensor) -> bool:
    return x.requires_grad or any(p.requires_grad for p in block.parameters())


@dataclass(frozen=True)
class _Spec:
    heads: int
    eps1: float
    eps2: float
    approximate: str  # GELU: "none" (exact erf) or "tanh"
    native: bool  # the fused C kernels of accel/c_kernels.py for LayerNorm, GELU and the bias sums
    lora_scale: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # qkv, proj, fc1, fc2: s = alpha / r
    ssf: tuple[bool, bool, bool, bool] = (False, False, False, False)  # qkv ... fc2: factors are SSF's scale, shift


def uses_c_kernels(block: Block) -> bool:
    """Whether :func:`block_forward` runs ``block`` with the C kernels of :mod:`.c_kernels`
    (available, and the exact GELU, the only one they implement) rather than ATen's."""
    return block.mlp.act.approximate == "none" and native.available()


def block_forward(block: Block, x: torch.Tensor) -> torch.Tensor:
    """``block(x)`` in training, as one autograd node (callers check :func:`applies`)."""
    # Both stochastic-depth masks are drawn before any compute, in the order the plain path draws them.
    keep1 = block.drop_path1.scale(x)
    keep2 = block.drop_path2.scale(x)
    attn, mlp = block.attn, block.mlp
    linears = [_layer(layer) for layer in (attn.qkv, attn.proj, mlp.fc1, mlp.fc2)]
    spec = _Spec(
        heads=attn.num_heads,
        eps1=block.norm1.eps,
        eps2=block.norm2.eps,
        approximate=mlp.act.approximate,
        native=uses_c_kernels(block),
        lora_scale=tuple(ln.lora_scale for ln in linears),  # type: ignore[arg-type]
        ssf=tuple(ln.ssf for ln in linears),  # type: ignore[arg-type]
    )
    qkv, proj, fc1, fc2 = linears
    out: torch.Tensor = _BlockFunction.apply(
        x,
        keep1,
        keep2,
        spec,
        block.workspace,
        block.scratch,
        block.norm1.weight,
        block.norm1.bias,
        qkv.weight,
        qkv.bias,
        proj.weight,
        proj.bias,
        block.norm2.weight,
        block.norm2.bias,
        fc1.weight,
        fc1.bias,
        fc2.weight,
        fc2.bias,
        *qkv.factors,
        *proj.factors,
        *fc1.factors,
        *fc2.factors,
    )
    return out


@dataclass(frozen=True)
class _Linear:
    """A linear layer as the node takes it: its (effective) weight and bias, and its two factors whose gradients the
    node forms itself (LoRA's A and B with ``lora_scale``; SSF's scale and shift with ``ssf``), else None."""

    weight: torch.Tensor
    bias: torch.Tensor
    factors: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    lora_scale: float = 0.0
    ssf: bool = False


def _layer(layer: nn.Module) -> _Linear:
    """How the node takes a linear layer: a LoRA layer over a frozen weight as its effective weight ``W + s B A``,
    formed outside autograd (a constant of the node), and its factors; an SSF layer over a frozen linear with a bias
    (and a scale no smaller than :data:`SSF_SCALE_FLOOR`) as the constants ``diag(gamma) W`` and ``gamma b + beta``
    and its scale and shift (see the module's notes); any other layer as its ``weight`` and ``bias`` (an adapter
    whose base trains too: the effective ones, which autograd differentiates), with no factors."""
    if type(layer) is LoRALinear and not layer.base_layer.weight.requires_grad:
        with torch.no_grad():
            w = layer.weight
        return _Linear(weight=w, bias=layer.bias, factors=(layer.lora_A.weight, layer.lora_B.weight),
                       lora_scale=layer.scaling)  # fmt: skip
    if type(layer) is SSF and _ssf_applies(layer):
        with torch.no_grad():
            w, bias = layer.weight, layer.bias
        return _Linear(weight=w, bias=bias, factors=(layer.ssf_scale, layer.ssf_shift), ssf=True)
    return _Linear(weight=layer.weight, bias=layer.bias)


def _ssf_applies(layer: SSF) -> bool:
    base = layer.base_layer
    return (
        type(base) is nn.Linear
        and not base.weight.requires_grad
        and base.bias is not None
        and not base.bias.requires_grad
        and layer.ssf_shift is not None
        and bool(layer.ssf_scale.detach().abs().min() >= SSF_SCALE_FLOOR)
    )


def _lora_grads(
    dy: list[torch.Tensor], x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None, s: float, need: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dA, dB)`` of a LoRA layer ``y = x (W + s B A)^T + bias`` from its input ``x`` (``m x in``) and its output
    gradient, given as column blocks ``dy`` (the qkv layer's three, else one): ``dB = s dY^T (x A^T)``,
    ``dA = s (dY B)^T x`` (None, None: no factors, or none needs a gradient)."""
    if a is None or b is None or not need:
        return None, None
    xa = torch.mm(x, a.t())  # (m, r)
    rows = [z.shape[1] for z in dy]
    # (x A^T)^T dY, then transposed: MKL reduces over the m rows of two tall matrices faster in this order
    d_b = torch.cat([xa.t().mm(z) for z in dy], dim=1).t().mul_(s)
    dyb = dy[0].mm(b[: rows[0]])
    start = rows[0]
    for z, n in zip(dy[1:], rows[1:], strict=True):
        dyb.addmm_(z, b[start : start + n])
        start += n
    return dyb.t().mm(x).mul_(s), d_b


def _ssf_grads(
    y_dy: torch.Tensor, d_shift: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d gamma, d beta)`` of an SSF layer ``y = gamma * z + beta`` from ``sum_m dY * y`` and ``sum_m dY`` (per
    output channel): ``d gamma = sum_m dY * z = (sum_m dY * y - beta * d beta) / gamma``."""
    return (y_dy - shift * d_shift).div_(scale), d_shift


def _linear(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ w.T + bias`` (into ``out`` if given): the GEMM, then the bias in place, which is faster
    on the CPU than ``torch.addmm``'s fill with the broadcast bias, then accumulate."""
    return torch.mm(a, w.t(), out=out).add_(bias)


def _heads(qkv: torch.Tensor, b: int, t: int, heads: int) -> tuple[torch.Tensor, ...]:
    """``(B*T, 3D)`` -> q, k, v as ``(B, heads, T, head_dim)`` views (no copy)."""
    return qkv.view(b, t, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def _residual(
    x: torch.Tensor,
    bias: torch.Tensor,
    a: torch.Tensor,
    w: torch.Tensor,
    keep: torch.Tensor | None,
    b: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x + keep * (a @ w.T + bias)`` on ``(B*T, D)`` rows (into ``out`` if given); without stochastic
    depth the bias and the residual go in one pass and the GEMM accumulates onto them."""
    if keep is None:
        return torch.add(x, bias, out=out).addmm_(a, w.t())
    rows = (b, -1, x.shape[1])
    y = _linear(a, w, bias).view(rows)
    return torch.addcmul(x.view(rows), y, keep, out=None if out is None else out.view(rows)).view_as(x)


def _layer_norm(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, eps: float, buf: Alloc, tag: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, d = x.shape
    return _aten.native_layer_norm.out(
        x,
        [d],
        w,
        bias,
        eps,
        out0=buf("xn" + tag, (m, d), x),
        out1=buf("mean" + tag, (m, 1), x),
        out2=buf("rstd" + tag, (m, 1), x),
    )


def _scaled(g: torch.Tensor, keep: torch.Tensor | None, b: int) -> torch.Tensor:
    return g if keep is None else (g.view(b, -1, g.shape[1]) * keep).view_as(g)


class _BlockFunction(torch.autograd.Function):
    """Eq. 2-3 forward and backward; see the module docstring."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        keep1: torch.Tensor | None,
        keep2: torch.Tensor | None,
        spec: _Spec,
        workspace: Workspace | None,
        scratch: Scratch | None,
        n1_w: torch.Tensor,
        n1_b: torch.Tensor,
        qkv_w: torch.Tensor,
        qkv_b: torch.Tensor,
        proj_w: torch.Tensor,
        proj_b: torch.Tensor,
        n2_w: torch.Tensor,
        n2_b: torch.Tensor,
        fc1_w: torch.Tensor,
        fc1_b: torch.Tensor,
        fc2_w: torch.Tensor,
        fc2_b: torch.Tensor,
        *factors: torch.Tensor | None,  # qkv's, proj's, fc1's, fc2's: LoRA's A and B, SSF's scale and shift, or None
    ) -> torch.Tensor:
        b, t, d = x.shape
        m, hidden = b * t, fc1_w.shape[0]
        buf = workspace.lease(ctx) if workspace is not None else fresh
        # The output goes to the caller: never a leased buffer, at most one nobody holds any more.
        out_buf = workspace.returned("out", (m, d), x) if workspace is not None else x.new_empty((m, d))
        x0 = x.reshape(m, d)
        if spec.native:
            x0 = x0.contiguous()
            # LayerNorm 1 also writes x + proj_b, which the projection's GEMM accumulates onto
            # (with stochastic depth, the branch is scaled per sample first: ATen's addcmul).
            xn1, mean1, rstd1, x1 = (
                buf("xn1", (m, d), x),
                buf("mean1", (m, 1), x),
                buf("rstd1", (m, 1), x),
                buf("x1", (m, d), x),
            )
            pre = {} if keep1 is not None else {"residual_bias": proj_b, "residual_out": x1}
            native.layer_norm(x0, n1_w, n1_b, spec.eps1, out=xn1, mean=mean1, rstd=rstd1, **pre)
        else:
            xn1, mean1, rstd1 = _layer_norm(x0, n1_w, n1_b, spec.eps1, buf, "1")
        qkv = _linear(xn1, qkv_w, qkv_b, buf("qkv", (m, 3 * d), x))
        q, k, v = _heads(qkv, b, t, spec.heads)
        o, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
        o2 = o.transpose(1, 2).reshape(m, d)  # the kernel writes token-major: a view
        if spec.native:
            x1 = x1.addmm_(o2, proj_w.t()) if keep1 is None else _residual(x0, proj_b, o2, proj_w, keep1, b, out=x1)
            xn2, mean2, rstd2 = buf("xn2", (m, d), x), buf("mean2", (m, 1), x), buf("rstd2", (m, 1), x)
            pre = {} if keep2 is not None else {"residual_bias": fc2_b, "residual_out": out_buf}
            native.layer_norm(x1, n2_w, n2_b, spec.eps2, out=xn2, mean=mean2, rstd=rstd2, **pre)
            h = torch.mm(xn2, fc1_w.t(), out=buf("h", (m, hidden), x))  # kept without fc1's bias
            g = buf("g", (m, hidden), x)
            native.bias_gelu(h, fc1_b, out=g)
            out = (
                out_buf.addmm_(g, fc2_w.t()) if keep2 is None else _residual(x1, fc2_b, g, fc2_w, keep2, b, out=out_buf)
            )
        else:
            x1 = _residual(x0, proj_b, o2, proj_w, keep1, b, out=buf("x1", (m, d), x))
            xn2, mean2, rstd2 = _layer_norm(x1, n2_w, n2_b, spec.eps2, buf, "2")
            h = _linear(xn2, fc1_w, fc1_b, buf("h", (m, hidden), x))
            g = _aten.gelu.out(h, approximate=spec.approximate, out=buf("g", (m, hidden), x))
            out = _residual(x1, fc2_b, g, fc2_w, keep2, b, out=out_buf)
        ctx.spec = spec
        ctx.shape = (b, t, d)
        ctx.scratch = scratch
        ctx.returned = workspace
        ctx.save_for_backward(
            x0, xn1, mean1, rstd1, qkv, o, lse, x1, xn2, mean2, rstd2, h, g, keep1, keep2,
            n1_w, n1_b, qkv_w, proj_w, n2_w, n2_b, fc1_w, fc1_b, fc2_w,
            out if spec.ssf[3] else None,  # the stream after fc2: its output for an SSF fc2's scale gradient
            *factors,
        )  # fmt: skip
        return out.view(b, t, d)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (x0, xn1, mean1, rstd1, qkv, o, lse, x1, xn2, mean2, rstd2, h, g, keep1, keep2,
         n1_w, n1_b, qkv_w, proj_w, n2_w, n2_b, fc1_w, fc1_b, fc2_w, out, *factors) = ctx.saved_tensors  # fmt: skip
        spec: _Spec = ctx.spec
        factors = factors or (None,) * 8  # (called without the factors: no adapter)
        # Each layer's two factors, as LoRA's (A, B) or SSF's (scale, shift): the other pair is (None, None).
        lora = [(a, b) if not ssf else (None, None) for a, b, ssf in zip(factors[::2], factors[1::2], spec.ssf)]
        ssf = [(a, b) if ssf else (None, None) for a, b, ssf in zip(factors[::2], factors[1::2], spec.ssf)]
        (qkv_a, qkv_lb), (proj_a, proj_lb), (fc1_a, fc1_lb), (fc2_a, fc2_lb) = lora
        s_qkv, s_proj, s_fc1, s_fc2 = spec.lora_scale
        (qkv_g, qkv_s), (proj_g, proj_s), (fc1_g, fc1_s), (fc2_g, fc2_s) = ssf
        b, t, d = ctx.shape
        m, hidden = b * t, h.shape[1]
        need = ctx.needs_input_grad
        dy = grad.reshape(m, d)
        if spec.native:
            dy = dy.contiguous()  # the C kernels read rows
        scratch: Scratch | None = ctx.scratch
        with scratch.borrow() if scratch is not None else contextlib.nullcontext(fresh) as tmp:
            # MLP branch, Eq. 3: out = x1 + keep2 * fc2(gelu(fc1(LN2(x1))))
            dm = _scaled(dy, keep2, b)
            d_fc2_w = dm.t().mm(g) if need[16] else None
            d_fc2_a, d_fc2_lb = _lora_grads([dm], g, fc2_a, fc2_lb, s_fc2, any(need[24:26]))
            dg = torch.mm(dm, fc2_w, out=tmp("dg", (m, hidden), dy))
            if spec.native:
                # One pass each: the GELU backward with fc1's bias sum; LayerNorm 2's backward with the
                # residual gradient added and the bias sums of fc2 (dy) and of the projection (dx1),
                # which stochastic depth scales per sample (then ATen sums the scaled gradients).
                dh, d_fc1_b = dg, dy.new_empty(hidden)
                native.gelu_backward(dg, h, fc1_b, out=dh, bias_grad=d_fc1_b)
                dxn2 = torch.mm(dh, fc1_w, out=tmp("dxn2", (m, d), dy))
                dx1, d_n2_w, d_n2_b = tmp("dx1", (m, d), dy), dy.new_empty(d), dy.new_empty(d)
                d_fc2_b = dy.new_empty(d) if keep2 is None else dm.sum(0)
                d_proj_b = dy.new_empty(d) if keep1 is None else None  # else summed from da below
                native.layer_norm_backward(
                    dxn2, x1, mean2, rstd2, n2_w, out=dx1, weight_grad=d_n2_w, bias_grad=d_n2_b, residual=dy,
                    residual_sum=d_fc2_b if keep2 is None else None, out_sum=d_proj_b,
                )  # fmt: skip
            else:
                d_proj_b = None
                d_fc2_b = dm.sum(0) if need[17] or fc2_g is not None else None
                dh = _aten.gelu_backward.grad_input(dg, h, approximate=spec.approximate, grad_input=dg)
                d_fc1_b = dh.sum(0) if need[15] or fc1_g is not None else None
                dxn2 = torch.mm(dh, fc1_w, out=tmp("dxn2", (m, d), dy))
                dx1, d_n2_w, d_n2_b = _aten.native_layer_norm_backward(
                    dxn2, x1, [d], mean2, rstd2, n2_w, n2_b, [True, need[12], need[13]]
                )
                dx1.add_(dy)
            d_fc1_w = dh.t().mm(xn2) if need[14] else None
            d_fc1_a, d_fc1_lb = _lora_grads([dh], xn2, fc1_a, fc1_lb, s_fc1, any(need[22:24]))
            # SSF: fc2's output is the stream's step (out - x1 = keep2 * y); fc1's is its pre-activation (the C
            # kernels keep it without the bias).
            d_fc2_g = d_fc2_s = d_fc1_g = d_fc1_s = None
            if fc2_g is not None and any(need[24:26]):
                y_dy = torch.sub(out, x1, out=tmp("ssf", (m, d), dy)).mul_(dy).sum(0)
                d_fc2_g, d_fc2_s = _ssf_grads(y_dy, d_fc2_b, fc2_g, fc2_s)
            if fc1_g is not None and any(need[22:24]):
                y_dy = torch.mul(dh, h, out=tmp("ssf_h", (m, hidden), dy)).sum(0)
                if spec.native:
                    y_dy.add_(fc1_b * d_fc1_b)
                d_fc1_g, d_fc1_s = _ssf_grads(y_dy, d_fc1_b, fc1_g, fc1_s)

            # Attention branch, Eq. 2: x1 = x + keep1 * proj(MSA(q, k, v)), [q; k; v] = qkv(LN1(x))
            da = _scaled(dx1, keep1, b)
            o2 = o.transpose(1, 2).reshape(m, d)
            d_proj_w = da.t().mm(o2) if need[10] else None
            d_proj_a, d_proj_lb = _lora_grads([da], o2, proj_a, proj_lb, s_proj, any(need[20:22]))
            if d_proj_b is None and (need[11] or proj_g is not None):
                d_proj_b = da.sum(0)
            d_proj_g = d_proj_s = None
            if proj_g is not None and any(need[20:22]):  # the projection's output is the stream's step
                y_dy = torch.sub(x1, x0, out=tmp("ssf", (m, d), dy)).mul_(dx1).sum(0)
                d_proj_g, d_proj_s = _ssf_grads(y_dy, d_proj_b, proj_g, proj_s)
            do = torch.mm(da, proj_w, out=tmp("do", (m, d), dy)).view(b, t, spec.heads, -1).transpose(1, 2)
            q, k, v = _heads(qkv, b, t, spec.heads)
            dq, dk, dv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, False)
            # The kernel returns token-major gradients: each is a (B*T, D) matrix as it lies, so the three
            # thirds of the qkv layer take them separately instead of stacking them into (B*T, 3D).
            parts = [z.transpose(1, 2).reshape(m, d) for z in (dq, dk, dv)]
            d_qkv_w = d_qkv_b = None
            if need[8]:
                d_qkv_w = qkv_w.new_empty(qkv_w.shape)
                for i, z in enumerate(parts):
                    torch.mm(z.t(), xn1, out=d_qkv_w[i * d : (i + 1) * d])
            if need[9] or qkv_g is not None:
                d_qkv_b = torch.cat([z.sum(0) for z in parts])
            d_qkv_a, d_qkv_lb = _lora_grads(parts, xn1, qkv_a, qkv_lb, s_qkv, any(need[18:20]))
            d_qkv_g = d_qkv_s = None
            if qkv_g is not None and any(need[18:20]):  # its output is kept: the attention's input
                y_dy = torch.cat(
                    [torch.mul(z, qkv[:, i * d : (i + 1) * d], out=tmp("ssf", (m, d), dy)).sum(0)
                     for i, z in enumerate(parts)]
                )  # fmt: skip
                d_qkv_g, d_qkv_s = _ssf_grads(y_dy, d_qkv_b, qkv_g, qkv_s)
            dxn1 = torch.mm(parts[0], qkv_w[:d], out=tmp("dxn1", (m, d), dy))
            for i in (1, 2):
                dxn1.addmm_(parts[i], qkv_w[i * d : (i + 1) * d])
            if spec.native:
                # The input gradient goes to the caller: fresh, or last step's if nobody holds that.
                workspace: Workspace | None = ctx.returned
                dx = workspace.returned("dx", (m, d), dy) if workspace is not None else dy.new_empty((m, d))
                d_n1_w, d_n1_b = dy.new_empty(d), dy.new_empty(d)
                native.layer_norm_backward(
                    dxn1, x0, mean1, rstd1, n1_w, out=dx, weight_grad=d_n1_w, bias_grad=d_n1_b, residual=dx1
                )
            else:
                dx, d_n1_w, d_n1_b = _aten.native_layer_norm_backward(
                    dxn1, x0, [d], mean1, rstd1, n1_w, n1_b, [need[0], need[6], need[7]]
                )
                if dx is not None:
                    dx.add_(dx1)
        # Nothing returned is a scratch buffer: those held only temporaries.
        if dx is not None:
            dx = dx.view(b, t, d)
        if (leased := getattr(ctx, "workspace", None)) is not None:
            leased.release(ctx)  # the next forward may overwrite the buffers now
        return (
            dx, None, None, None, None, None, d_n1_w, d_n1_b, d_qkv_w, d_qkv_b, d_proj_w, d_proj_b,
            d_n2_w, d_n2_b, d_fc1_w, d_fc1_b, d_fc2_w, d_fc2_b,
            *_either(d_qkv_a, d_qkv_lb, d_qkv_g, d_qkv_s), *_either(d_proj_a, d_proj_lb, d_proj_g, d_proj_s),
            *_either(d_fc1_a, d_fc1_lb, d_fc1_g, d_fc1_s), *_either(d_fc2_a, d_fc2_lb, d_fc2_g, d_fc2_s),
        )[: len(need)]  # fmt: skip


def _either(*grads: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A layer's two factors' gradients: LoRA's ``(dA, dB)`` or SSF's ``(d gamma, d beta)``, whichever it has."""
    return grads[:2] if grads[2] is None and grads[3] is None else grads[2:]
