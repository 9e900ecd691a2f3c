"""SSF (Lian et al. 2022, "Scaling & Shifting Your Features: A New Baseline for Efficient Model Tuning"): a frozen
layer followed by a trained per-channel scale and shift, ``y = gamma * f(x) + beta``. Both are linear in ``f``'s
output, so they merge into the layer before them: for a linear layer ``W' = diag(gamma) W``, ``b' = gamma b + beta``;
for a LayerNorm the same on its affine weight and bias. After merging the model is the plain one again.

The scale starts at one and the shift at zero (the paper draws them around those, std 0.02): the wrapped model
starts as the base model, as a LoRA-wrapped one does. A linear layer without a bias of its own (the q/v-bias
attention's ``qkv``, whose biases are separate parameters added after it) gets the scale alone: a shift would need a
bias the architecture does not have."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SSF"]


class SSF(nn.Module):
    """``base`` (an ``nn.Linear`` or an affine ``nn.LayerNorm``, frozen) followed by ``ssf_scale`` and ``ssf_shift``
    per output channel. Code that reads the layer's ``weight`` and ``bias`` directly reads the merged ones."""

    def __init__(self, base: nn.Linear | nn.LayerNorm) -> None:
        super().__init__()
        if isinstance(base, nn.LayerNorm) and not (base.elementwise_affine and base.bias is not None):
            raise ValueError("SSF merges into a LayerNorm's affine weight and bias; this one has none")
        w = base.weight
        n = w.shape[0]
        self.base_layer = base.requires_grad_(False)
        self.ssf_scale = nn.Parameter(torch.ones(n, device=w.device, dtype=w.dtype))
        if base.bias is not None:
            self.ssf_shift = nn.Parameter(torch.zeros(n, device=w.device, dtype=w.dtype))
        else:
            self.register_parameter("ssf_shift", None)

    @property
    def weight(self) -> torch.Tensor:
        w = self.base_layer.weight
        return w * self.ssf_scale.view(-1, *([1] * (w.ndim - 1)))

    @property
    def bias(self) -> torch.Tensor | None:
        b = self.base_layer.bias
        return None if b is None else b * self.ssf_scale + self.ssf_shift

    def __getattr__(self, name: str) -> object:
        """The base layer's other attributes (``in_features``, ``eps``, ``normalized_shape`` ...)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("_modules", {}).get("base_layer")  # (none while a copy is being built)
            if name == "base_layer" or base is None:
                raise
            return getattr(base, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x) * self.ssf_scale
        return y if self.ssf_shift is None else y + self.ssf_shift

    def merged(self) -> nn.Linear | nn.LayerNorm:
        """The base layer's class holding the merged weight and bias."""
        b = self.base_layer
        w = b.weight
        if isinstance(b, nn.LayerNorm):
            out: nn.Module = nn.LayerNorm(b.normalized_shape, eps=b.eps, device=w.device, dtype=w.dtype)
        else:
            out = nn.Linear(b.in_features, b.out_features, bias=b.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            out.weight.copy_(self.weight)
            if b.bias is not None:
                out.bias.copy_(self.bias)
        return out
