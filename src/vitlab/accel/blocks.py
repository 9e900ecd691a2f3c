"""The encoder block with its speed paths: :class:`FastBlock` is a :class:`~vitlab.models.Block`
with the same submodules and parameters, whose forward takes the oneDNN inference path
(:mod:`.onednn`) or the fused training node (:mod:`.fused_block`) when they apply, and the
plain forward of Eq. 2-3 otherwise.

A block whose layers are wrapped by LoRA or SSF (:class:`~vitlab.adapters.lora.LoRALinear`,
:class:`~vitlab.adapters.ssf.SSF`: ``vitlab finetune --lora``, ``--tune ssf``) also trains through the fused node:
each wrapped layer enters it by its effective weight and bias (LoRA's ``W + (alpha / r) B A``, SSF's
``diag(scale) W`` and ``scale * b + shift``, on a LayerNorm its affine pair likewise). SSF's are the layer's
``weight`` and ``bias``, tensors that autograd differentiates back into the adapters: the step costs a full
fine-tune's plus the adapters' small products. LoRA's effective weight over a frozen ``W`` is a constant of the node,
which forms ``A``'s and ``B``'s gradients by thin products (:mod:`.fused_block`): the step skips the full weight
gradients a full fine-tune forms."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..adapters.lora import LoRALinear
from ..adapters.ssf import SSF
from ..models.layers import Attention, Block, DropPath, Mlp
from . import fused_block, onednn
from .buffers import Scratch, Workspace
from .switch import enabled, running_eagerly, unchanged

__all__ = ["BLOCK_LAYOUT", "FastBlock", "adapted_block", "paper_block"]

BLOCK_LAYOUT: dict[str, type | tuple[type, ...]] = {
    "norm1": nn.LayerNorm,
    "attn": Attention,
    "attn.qkv": nn.Linear,
    "attn.q_norm": nn.Identity,
    "attn.k_norm": nn.Identity,
    "attn.proj": nn.Linear,
    "attn.proj_drop": nn.Dropout,
    "ls1": nn.Identity,
    "drop_path1": DropPath,
    "norm2": nn.LayerNorm,
    "mlp": Mlp,
    "mlp.fc1": nn.Linear,
    "mlp.act": (nn.GELU, nn.ReLU),
    "mlp.drop1": nn.Dropout,
    "mlp.fc2": nn.Linear,
    "mlp.drop2": nn.Dropout,
    "ls2": nn.Identity,
    "drop_path2": DropPath,
}
"""The submodules (and their classes) a :class:`Block` is built with: the speed paths run
only on a block that still has exactly these. The options they do not implement (layer scale
``ls1``/``ls2``, qk-norm ``attn.q_norm``/``attn.k_norm``) are identities here, so a block built
with one of them takes the plain forward; so does one with a submodule more (RoPE's ``attn.rope``,
``attn.norm``, ``mlp.norm``) or another MLP (SwiGLU)."""


def paper_block(block: nn.Module) -> bool:
    """Whether ``block`` is the paper's block as built (:data:`BLOCK_LAYOUT`, :func:`.switch.unchanged`) and its
    attention holds no parameters of its own: the q/v-only biases of BEiT, EVA and DINOv3 (``attn.q_bias``,
    ``attn.v_bias``) are parameters, not submodules, and the speed paths read ``attn.qkv.bias`` alone."""
    return unchanged(block, BLOCK_LAYOUT) and not block.attn._parameters


_LINEARS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
_NORMS = ("norm1", "norm2")


def adapted_block(block: nn.Module) -> bool:
    """Whether ``block`` is the paper's block as built except that some of its four linears are wrapped by LoRA or
    SSF and its LayerNorms by SSF (and nothing else): the fused training node then takes their effective weights
    (see the module's notes). A LoRA layer's own forward is ``W x + b + (alpha / r) B A x``, the node's
    ``(W + (alpha / r) B A) x + b``; an SSF layer's ``scale * (W x + b) + shift``, the node's
    ``(diag(scale) W) x + (scale * b + shift)``: the same functions to float rounding."""
    layout = dict(BLOCK_LAYOUT)
    modules = dict(block.named_modules())
    wrapped = 0
    for name in _LINEARS + _NORMS:  # (a SwiGLU MLP has no fc1: its block is no paper block, and unchanged() says so)
        m = modules.get(name)
        if type(m) is LoRALinear and name in _LINEARS:
            layout.update({name: LoRALinear, f"{name}.base_layer": nn.Linear, f"{name}.lora_A": nn.Linear,
                           f"{name}.lora_B": nn.Linear})  # fmt: skip
        elif type(m) is SSF and m.ssf_shift is not None:
            layout.update({name: SSF, f"{name}.base_layer": layout[name]})
        else:
            continue
        wrapped += 1
    return wrapped > 0 and unchanged(block, layout) and not block.attn._parameters


class FastBlock(Block):
    """:class:`~vitlab.models.Block` plus the buffers its fused training path keeps between steps.

    Its state dict, submodules and results (to float32 rounding) are those of the plain block.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._init_accel()

    def _init_accel(self) -> None:
        self.workspace = Workspace()
        """Activation buffers the fused training path reuses between steps."""
        self.scratch = Scratch()
        """Its backward's temporaries; a model's blocks share one (:func:`.buffers.share_scratch`)."""

    def accelerable(self) -> bool:
        """Whether a speed path may stand in for the plain forward: the switch is on, the forward
        runs eagerly (no tracer records it), and the block is exactly as built (no hooks inside,
        no replaced or wrapped layers)."""
        return enabled() and running_eagerly() and paper_block(self)

    def trains_fused_with_adapters(self, x: torch.Tensor) -> bool:
        """Whether this training forward on ``x`` runs the fused node with the adapters' effective weights
        (:func:`adapted_block`): the switch on, an eager forward, the node's own conditions."""
        return enabled() and running_eagerly() and adapted_block(self) and fused_block.applies(self, x)

    def train(self, mode: bool = True) -> FastBlock:
        if mode:  # packed inference weights would go stale and hold memory
            onednn.forget(self)
        else:  # nor are the training path's buffers needed in eval
            self.workspace.clear()
            self.scratch.clear()
        return super().train(mode)

    def forward(
        self, x: torch.Tensor, *, return_attention: bool = False, **kw: Any
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not return_attention and not kw and self.accelerable():
            if onednn.applies(self, x):
                return onednn.block_forward(self, x)
            if fused_block.applies(self, x):
                return fused_block.block_forward(self, x)
        elif not return_attention and not kw and self.trains_fused_with_adapters(x):
            return fused_block.block_forward(self, x)
        return super().forward(x, return_attention=return_attention, **kw)  # (options it does not implement)

    def forward_cls(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output for the first (class) token only: ``(B, T, D)`` -> ``(B, 1, D)``.

        Eq. 2-3 mix tokens only inside attention, so the class token's output needs the keys
        and values of every token but the query, the projection and the MLP of the class token
        alone: what ``self(x)[:, :1]`` computes, with a quarter of the work or less. Same maths,
        float32 rounding aside."""
        attn = self.attn
        b, t, d = x.shape
        xn = self.norm1(x)
        w, bias = attn.qkv.weight, attn.qkv.bias
        q = F.linear(xn[:, :1], w[:d], None if bias is None else bias[:d]).view(b, 1, attn.num_heads, attn.head_dim)
        kv = F.linear(xn, w[d:], None if bias is None else bias[d:]).view(b, t, 2, attn.num_heads, attn.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4).unbind(0)
        drop = attn.attn_drop if self.training else 0.0
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, dropout_p=drop).transpose(1, 2).reshape(b, 1, d)
        x = x[:, :1] + self.drop_path1(attn.proj_drop(attn.proj(o)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))
