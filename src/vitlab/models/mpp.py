"""Masked patch prediction, the paper's self-supervised objective (Sec. 4.6, Appendix B.1.2).

"We corrupt 50% of patch embeddings by either replacing their embeddings with
a learnable [mask] embedding (80%), a random other patch embedding (10%) or
just keeping them as is (10%) ... we predict the 3-bit, mean color (i.e., 512
colors in total) of every corrupted patch using their respective patch
representations."

The wrapper owns the [mask] embedding and the 512-way prediction head; the
wrapped :class:`VisionTransformer` is unchanged, so after pre-training it is
saved and fine-tuned like any other ViT.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .vit import VisionTransformer

__all__ = ["MPPOutput", "MaskedPatchPrediction", "mean_colour_targets"]


def mean_colour_targets(images: torch.Tensor, *, patch: int, bits: int = 3) -> torch.Tensor:
    """Class index of each patch's mean colour quantised to ``bits`` per channel.

    ``images`` are in [0, 1], ``(B, 3, H, W)``; returns ``(B, N)`` in ``[0, 2^(3*bits))``,
    patches in row-major order (as the patch embedding orders them).
    """
    b, c = images.shape[:2]
    means = F.avg_pool2d(images, patch).flatten(2).transpose(1, 2)  # (B, N, C)
    levels = 2**bits
    q = (means * levels).floor().clamp_(0, levels - 1).long()
    idx = torch.zeros(b, q.shape[1], dtype=torch.long, device=images.device)
    for ch in range(c):
        idx = idx * levels + q[..., ch]
    return idx


@dataclass
class MPPOutput:
    loss: torch.Tensor
    """Cross-entropy of the colour prediction, the mean over the corrupted patches."""
    accuracy: torch.Tensor
    """Top-1 accuracy of the colour prediction over the corrupted patches."""
    logits: torch.Tensor
    """``(B, N, 2^(3*bits))``: every patch's colour logits (``logits[corrupted]``: the predicted ones)."""
    targets: torch.Tensor
    """``(B, N)``: every patch's colour class."""
    corrupted: torch.Tensor
    """Boolean ``(B, N)``: which patches were corrupted (and predicted)."""


class MaskedPatchPrediction(nn.Module):
    """Wrap a ViT for masked-patch-prediction pre-training."""

    def __init__(
        self,
        model: VisionTransformer,
        *,
        corrupt_prob: float = 0.5,
        mask_prob: float = 0.8,
        random_prob: float = 0.1,
        bits: int = 3,
        switched_token_drop: bool = False,
    ) -> None:
        """``switched_token_drop``: ``model`` may be built with token dropping (``patch_drop_rate``), which the
        caller sets to 0 for the forwards of this wrapper (a warm start before classification that drops tokens);
        a training forward that would drop tokens is refused. Otherwise such a model is refused here."""
        super().__init__()
        if model.config.hybrid_layers is not None or model.config.stem != "patch":
            raise ValueError("masked patch prediction needs a plain ViT: a hybrid's patches are not pixel patches")
        if model.config.patch_drop_rate and not switched_token_drop:
            raise ConfigError("masked patch prediction predicts every patch: it cannot drop tokens (patch_drop_rate)")
        if not 0.0 < corrupt_prob <= 1.0 or mask_prob + random_prob > 1.0:
            raise ValueError("corrupt_prob must be in (0, 1] and mask_prob + random_prob <= 1")
        self.model = model
        self.corrupt_prob, self.mask_prob, self.random_prob, self.bits = corrupt_prob, mask_prob, random_prob, bits
        d = model.config.embed_dim
        self.mask_token = nn.Parameter(torch.zeros(1, 1, d))
        nn.init.normal_(self.mask_token, std=0.02)
        self.mpp_head = nn.Linear(d, 2 ** (3 * bits))

    def no_weight_decay(self) -> set[str]:
        """The ViT's own exclusions (under ``model.``) and the [mask] embedding, for optimiser groups."""
        return {f"model.{n}" for n in self.model.no_weight_decay()} | {"mask_token"}

    def corrupt(
        self, tokens: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply the 50% / (80, 10, 10) corruption to patch embeddings ``(B, N, D)``."""
        b, n, _ = tokens.shape
        dev = tokens.device

        def rand(*shape: int) -> torch.Tensor:
            return torch.rand(*shape, generator=generator, device="cpu").to(dev)

        corrupted = rand(b, n) < self.corrupt_prob
        u = rand(b, n)
        use_mask = corrupted & (u < self.mask_prob)
        use_random = corrupted & (u >= self.mask_prob) & (u < self.mask_prob + self.random_prob)
        # a random other patch embedding from anywhere in the batch
        src = (torch.rand(b, n, generator=generator, device="cpu") * (b * n)).long().to(dev)
        random_tokens = tokens.reshape(b * n, -1)[src.flatten()].reshape_as(tokens)
        out = torch.where(use_mask[..., None], self.mask_token.to(tokens.dtype).expand_as(tokens), tokens)
        out = torch.where(use_random[..., None], random_tokens, out)
        return out, corrupted

    def forward(
        self, images: torch.Tensor, *, pixels: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> MPPOutput:
        """``images`` as the model takes them (normalised); ``pixels`` the same in [0, 1]
        (derived from the model's mean/std when omitted)."""
        vit = self.model
        cfg = vit.config
        if self.training and getattr(vit.patch_drop, "p", 0.0) > 0:
            raise ConfigError("masked patch prediction predicts every patch: set the token-drop rate to 0 first")
        if pixels is None:
            mean = torch.tensor(cfg.mean, device=images.device).view(1, -1, 1, 1)
            std = torch.tensor(cfg.std, device=images.device).view(1, -1, 1, 1)
            pixels = (images * std + mean).clamp(0, 1)
        targets = mean_colour_targets(pixels, patch=cfg.patch_size, bits=self.bits)
        grid = vit.patch_embed.grid(*images.shape[-2:])
        tokens, corrupted = self.corrupt(vit.patch_embed(images), generator)
        z = vit.encode(vit.embed_tokens(tokens, grid), grid)["encoded"][:, vit.num_prefix_tokens :]
        # every patch is predicted and the loss weighs the corrupted ones: shapes that do not depend on the draw
        logits = self.mpp_head(z)
        weight = corrupted.float()  # counts in float32: bf16 would round a count above 256
        count = weight.sum().clamp(min=1)
        loss = (F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none") * weight.flatten()).sum()
        acc = ((logits.argmax(-1) == targets).float() * weight).sum() / count
        return MPPOutput(loss=loss / count, accuracy=acc, logits=logits, targets=targets, corrupted=corrupted)
