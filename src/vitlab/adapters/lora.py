"""LoRA (Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language Models"): a frozen linear layer plus a trained
low-rank update, ``h = W x + b + (alpha / r) B A x``, with ``A`` (``r x in``) drawn as a linear layer's weights are
(Kaiming-uniform) and ``B`` (``out x r``) zero, so that the wrapped model starts as the base model. After training
the update merges into the weight, ``W' = W + (alpha / r) B A``, and the model is the plain one again.

Names follow Hugging Face ``peft`` (``base_layer``, ``lora_A``, ``lora_B``: a wrapped ``blocks.0.attn.qkv`` holds
``blocks.0.attn.qkv.lora_A.weight``), so that the adapters alone save in its layout (:mod:`.peft_files`)."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LoRALinear"]


class LoRALinear(nn.Module):
    """``base`` (frozen) plus the low-rank update of rank ``rank`` scaled by ``alpha / rank``.

    The forward adds ``B (A x)`` to the base layer's output (two thin products, never the full update), so that a
    step costs little more than the frozen layer's and no gradient of ``W`` is formed. Code that reads the layer's
    ``weight`` directly (the q/v-bias attention's ``F.linear(x, qkv.weight, bias)``) reads the effective weight
    ``W + (alpha / r) B A``: the same function either way."""

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"a LoRA rank must be >= 1, got {rank}")
        w = base.weight
        self.base_layer = base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=w.device, dtype=w.dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=w.device, dtype=w.dtype)
        self.rank, self.alpha = rank, float(alpha)
        self.scaling = self.alpha / rank
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # nn.Linear's own draw (peft's default)
        nn.init.zeros_(self.lora_B.weight)

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def delta(self) -> torch.Tensor:
        """The update ``(alpha / r) B A`` (``out x in``)."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    @property
    def weight(self) -> torch.Tensor:
        """The effective weight ``W + (alpha / r) B A`` (differentiable in ``A`` and ``B``)."""
        return self.base_layer.weight + self.delta()

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding ``W + (alpha / r) B A`` and the base bias (computed in float64, then
        rounded once to the weight's dtype), its ``requires_grad`` as the base layer's was before wrapping: on."""
        b = self.base_layer
        out = nn.Linear(b.in_features, b.out_features, bias=b.bias is not None, device=b.weight.device,
                        dtype=b.weight.dtype)  # fmt: skip
        with torch.no_grad():
            d = (self.lora_B.weight.double() @ self.lora_A.weight.double()) * self.scaling
            out.weight.copy_((b.weight.double() + d).to(b.weight.dtype))
            if b.bias is not None:
                out.bias.copy_(b.bias)
        return out

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"
