"""Patch-whitening initialisation of a first convolution, from the CIFAR-10 speed records (hlb-CIFAR10; Jordan
2024, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU", airbench): before training, the first layer's filters are
set to the principal directions of the images' patches, each scaled by the inverse square root of its variance,
so that the layer starts by decorrelating its input patches instead of mixing them at random.

It applies to any plain first convolution: the ViT's patch embedding (Eq. 1's E as a convolution with kernel =
stride = P whitens the P x P patches it projects) and the first convolution of CCT's tokenizer
(:class:`~.hybrid.ConvTokenizer`, 3x3 patches with padding 1). A model's first convolution is named by its
``pretrained_cfg["first_conv"]`` (``model.get_submodule(model.pretrained_cfg["first_conv"])``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError

__all__ = ["patch_moments", "whiten_init_"]


def patch_moments(conv: nn.Conv2d, images: torch.Tensor, *, batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, covariance)`` in float64 of the patches ``conv`` sees in ``images`` (its kernel, stride, padding
    and dilation; zero padding included), flattened as its filters are (channel, row, column). The images are
    read ``batch`` at a time, so memory stays at one batch's patches however many images are given."""
    _check(conv, images)
    k = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
    total = torch.zeros(k, dtype=torch.float64, device=images.device)
    outer = torch.zeros(k, k, dtype=torch.float64, device=images.device)
    n = 0
    for chunk in images.split(batch):
        cols = F.unfold(
            chunk.double(), conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride
        )
        cols = cols.transpose(1, 2).reshape(-1, k)  # one row per patch
        n += cols.shape[0]
        total += cols.sum(0)
        outer += cols.T @ cols
    if n < 2:
        raise InputError(f"whitening needs at least 2 patches, the {len(images)} image(s) give {n}")
    mean = total / n
    return mean, outer / n - torch.outer(mean, mean)


@torch.no_grad()
def whiten_init_(conv: nn.Conv2d, images: torch.Tensor, *, eps: float = 5e-4, negated: bool = False) -> int:
    """Set the first filters of ``conv`` to whiten its input patches in ``images`` ``(N, C, H, W)`` (the model's
    inputs, normalised as it sees them); returns how many output channels were set.

    With ``Cov = V diag(l) V^T`` the covariance of the patches (:func:`patch_moments`), filter ``i`` is
    ``v_i / sqrt(l_i + eps)`` for the eigenvectors in order of decreasing eigenvalue, as many as the patches have
    values and the layer has channels; the output channels they make have covariance ``diag(l_i / (l_i + eps))``:
    the identity for every direction well above ``eps``, which keeps the noise directions from being amplified.
    ``negated`` also sets the negated filters after them (airbench's pairs ``v, -v``, for a ReLU after the layer:
    CCT's tokenizer), half the channels each. A bias, if the layer has one, is set so the whitened channels have
    zero mean. The other channels keep their initialisation.

    Unlike airbench, which whitens the uncentred second moment, the covariance here is centred; the difference
    vanishes for inputs normalised to zero mean."""
    if not (math.isfinite(eps) and eps > 0):
        raise ConfigError(f"eps: must be a positive number, got {eps}")
    mean, cov = patch_moments(conv, images)
    values, vectors = torch.linalg.eigh(cov)  # ascending
    values, vectors = values.flip(0).clamp(min=0), vectors.flip(1)
    count = min(len(values), conv.out_channels // 2 if negated else conv.out_channels)
    filters = (vectors[:, :count] / torch.sqrt(values[:count] + eps)).T  # (count, C * kh * kw)
    if negated:
        filters = torch.cat([filters, -filters])
    n = len(filters)
    conv.weight[:n] = filters.reshape(n, *conv.weight.shape[1:]).to(conv.weight)
    if conv.bias is not None:
        conv.bias[:n] = (-(filters @ mean)).to(conv.bias)
    return n


def _check(conv: nn.Module, images: torch.Tensor) -> None:
    if type(conv) is not nn.Conv2d:  # (a weight-standardised conv, as the ResNet stem's, would undo the whitening)
        raise ConfigError(f"whitening initialises a plain nn.Conv2d, got a {type(conv).__name__}")
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ConfigError("whitening needs an ungrouped convolution with numeric zero padding")
    if images.ndim != 4 or images.shape[1] != conv.in_channels or not images.is_floating_point():
        raise InputError(
            f"whitening takes float images (N, {conv.in_channels}, H, W), got {images.dtype} {tuple(images.shape)}"
        )
