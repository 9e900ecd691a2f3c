"""Attention health: the numbers that show a ViT's attention going wrong before the loss does.

:func:`attention_health` runs a model on a small fixed batch and measures, per layer:

- **mean attention distance** (pixels), the paper's Fig. 7 measure (:func:`.attention.attention_distance`),
  per head and averaged over heads, with the value uniform attention would give (``uniform_distance``);
- **attention entropy** in nats, ``-sum_k p_k log p_k`` over the keys of each query, averaged over the
  queries (every token, prefix tokens included) and the images, per head; ``log(tokens)`` is its maximum
  (uniform attention), 0 attention to one token. ``collapsed_fraction`` is the fraction of a layer's heads
  whose mean entropy is below ``collapse_threshold``: the *entropy collapse* of Zhai et al. 2023
  ("Stabilizing Transformer Training by Preventing Attention Entropy Collapse"), which comes with loss
  oscillation and divergence;
- the **largest attention logit** ``q . k / sqrt(D_h)`` before the softmax, after qk-norm and RoPE when the
  model has them: its unbounded growth is what made ViT-22B add qk-norm (Dehghani et al. 2023, Sec. 2);
- the **largest output-token norm over the median one** among the patch tokens of each block's output:
  the high-norm outlier tokens that registers absorb (Darcet et al. 2024, "Vision Transformers Need
  Registers"; class and register tokens are left out, so a model whose registers do their job scores low).

The queries and keys are taken from the exact forward the model runs: forward hooks on each attention's
``q_norm`` and ``k_norm`` (identities without qk-norm) and ``rope`` submodules record the tensors that the
attention itself multiplies, and :meth:`~vitlab.models.VisionTransformer.forward_intermediates` computes the
weights on the plain path (a hooked model is never run by a speed path: :mod:`vitlab.accel.switch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..devices import model_device
from ..errors import ConfigError, InputError
from ..models.layers import Attention
from .attention import attention_distance, pixel_grid, uniform_attention_distance

__all__ = ["COLLAPSE_THRESHOLD", "attention_entropy", "attention_health", "token_norm_ratio"]

COLLAPSE_THRESHOLD = 0.5
"""A head's mean attention entropy (nats) below which it counts as collapsed: ``exp(0.5)`` ~ 1.6, i.e. each
query spreads its weight over about one and a half keys. Zhai et al. 2023 give no cut-off (their collapsed
heads fall close to 0); this one is vitlab's, low enough that a trained local head (a few neighbours,
~1.5-2.5 nats) stays above it."""


def attention_entropy(attn: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's attention rows, ``(heads,)``, for weights ``(B, heads, T, T)``:
    over the queries and the batch, each row renormalised in float64 first, clamped to ``[0, log T]``."""
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (B, heads, T, T), got {tuple(attn.shape)}")
    a = attn.double()
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-300)
    ent = -torch.special.xlogy(a, a).sum(dim=-1)  # (B, heads, T)
    return ent.mean(dim=(0, 2)).clamp(0.0, math.log(attn.shape[-1]))


def token_norm_ratio(tokens: torch.Tensor) -> tuple[float, float, float]:
    """``(largest norm, median norm, largest / median)`` of the token vectors ``(B, N, D)``, pooled over
    the batch; the ratio is ``inf`` when the median norm is 0."""
    norms = tokens.double().norm(dim=-1).flatten()
    top, med = float(norms.max()), float(norms.median())
    return top, med, (top / med if med > 0 else math.inf)


class _LogitProbe:
    """Forward hooks that record the largest pre-softmax logit of each attention in the model's own forward.

    ``q_norm`` and ``k_norm`` (identities without qk-norm) and ``rope`` are the last steps each query and key
    take before the attention multiplies them; their outputs are what the attention uses."""

    def __init__(self, layers: list[list[Attention]]) -> None:
        self.max_logit: list[float | None] = [None] * len(layers)
        self.handles: list[Any] = []
        for i, attns in enumerate(layers):
            for attn in attns:
                self._watch(i, attn)

    def _watch(self, layer: int, attn: Attention) -> None:
        seen: dict[str, Any] = {}

        def keep(name: str) -> Callable[..., None]:
            def hook(_m: nn.Module, _args: Any, out: torch.Tensor) -> None:
                seen[name] = out

            return hook

        def rotated(_m: nn.Module, _args: Any, out: torch.Tensor) -> None:
            seen["q" if "qr" not in seen else "k"] = out  # the attention rotates q first, then k
            seen["qr"] = True

        def done(_m: nn.Module, _args: Any, _out: Any) -> None:
            q, k = seen.pop("q", None), seen.pop("k", None)
            seen.clear()
            if q is None or k is None:
                return
            # the product the attention computes, in float32 at least (half-precision q and k are widened first)
            top = float(((q.float() * attn.scale) @ k.float().transpose(-2, -1)).max())
            prev = self.max_logit[layer]
            self.max_logit[layer] = top if prev is None or top > prev else prev

        self.handles.append(attn.q_norm.register_forward_hook(keep("q")))
        self.handles.append(attn.k_norm.register_forward_hook(keep("k")))
        rope = getattr(attn, "rope", None)
        if isinstance(rope, nn.Module):
            self.handles.append(rope.register_forward_hook(rotated))
        self.handles.append(attn.register_forward_hook(done))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _unwrap(model: nn.Module) -> nn.Module:
    """The module under a ``torch.compile`` or ``DistributedDataParallel`` wrapper (its eager forward)."""
    for _ in range(4):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _num(x: float) -> float | None:
    """``x`` as a JSON number: None when it is not finite (a diverged model)."""
    x = float(x)
    return x if math.isfinite(x) else None


@torch.no_grad()
def attention_health(
    model: nn.Module, images: torch.Tensor, *, collapse_threshold: float = COLLAPSE_THRESHOLD
) -> dict[str, Any]:
    """Attention health of ``model`` on ``images`` (``(B, C, H, W)``, preprocessed as the model expects).

    The model runs in eval mode (no dropout, stochastic depth or token dropping, so no random draw) and
    without autograd; afterwards every submodule is back in its own train/eval mode and the hooks are gone,
    so a training run and its random state are untouched. The forward is the plain one (exact attention).

    Returns plain numbers and lists (JSON-serialisable; None for a value that is not finite), per-layer
    lists in block order:

    - ``layers``, ``heads``, ``tokens``, ``grid`` ``[rows, cols]``, ``pixels_per_patch``, ``num_images``;
    - ``distance`` (mean over heads) and ``distance_per_head`` (``[layer][head]``), pixels; ``uniform_distance``;
    - ``entropy`` (mean over heads) and ``entropy_per_head``, nats; ``max_entropy`` = ``log(tokens)``;
      ``collapse_threshold`` and ``collapsed_fraction`` (of the heads below it);
    - ``max_logit``: the largest ``q . k / sqrt(D_h)`` (None for a block without :class:`Attention`);
    - ``token_norm_max``, ``token_norm_median``, ``outlier_ratio``: over the patch tokens of each block's output.
    """
    model = _unwrap(model)
    if not callable(getattr(model, "forward_intermediates", None)) or not hasattr(model, "blocks"):
        raise ConfigError(f"attention health needs a vitlab VisionTransformer, got {type(model).__name__}")
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[0] == 0:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise InputError(f"attention health needs a non-empty image batch (B, C, H, W), got {shape}")
    if not collapse_threshold >= 0:
        raise ConfigError(f"collapse_threshold: expected a number of nats >= 0, got {collapse_threshold}")
    size = (int(images.shape[-2]), int(images.shape[-1]))
    grid, px = pixel_grid(model, size)
    prefix = int(model.num_prefix_tokens)
    probe = _LogitProbe([[m for m in blk.modules() if isinstance(m, Attention)] for blk in model.blocks])
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        out = model.forward_intermediates(images.to(model_device(model)))
    finally:
        probe.remove()
        model.train(modes[0][1])  # the modules' own train() (speed paths drop their buffers), then each flag
        for m, was in modes:
            m.training = was
    attns, blocks = out["attention"], out["blocks"]
    dist = attention_distance(attns, grid=grid, patch_size=px, num_prefix_tokens=prefix).double()
    ent = torch.stack([attention_entropy(a) for a in attns])  # (layers, heads)
    norms = [token_norm_ratio(z[:, prefix:]) for z in blocks]
    tokens = int(attns[0].shape[-1])
    return {
        "layers": len(attns),
        "heads": int(ent.shape[1]),
        "tokens": tokens,
        "grid": [grid[0], grid[1]],
        "pixels_per_patch": float(px),
        "num_images": int(images.shape[0]),
        "uniform_distance": _num(uniform_attention_distance(grid, px)),
        "distance": [_num(v) for v in dist.mean(dim=1)],
        "distance_per_head": [[_num(v) for v in row] for row in dist],
        "max_entropy": math.log(tokens),
        "entropy": [_num(v) for v in ent.mean(dim=1)],
        "entropy_per_head": [[_num(v) for v in row] for row in ent],
        "collapse_threshold": float(collapse_threshold),
        "collapsed_fraction": [float(v) for v in (ent < collapse_threshold).double().mean(dim=1)],
        "max_logit": [None if v is None else _num(v) for v in probe.max_logit],
        "token_norm_max": [_num(n[0]) for n in norms],
        "token_norm_median": [_num(n[1]) for n in norms],
        "outlier_ratio": [_num(n[2]) for n in norms],
    }
