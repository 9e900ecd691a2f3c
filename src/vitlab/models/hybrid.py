"""The hybrid architecture (Sec. 3.1, "Hybrid Architecture").

"As an alternative to raw image patches, the input sequence can be formed
from feature maps of a CNN ... the patch embedding projection E is applied to
patches extracted from a CNN feature map. As a special case, the patches can
have spatial size 1x1." The CNN is the paper's BiT ResNet (Kolesnikov et al.,
2020): weight-standardised convolutions, GroupNorm, TensorFlow "SAME" padding.

Module names follow timm's ``ResNetV2`` inside ``HybridEmbed``
(``patch_embed.backbone.stem.conv``, ``...stages.0.blocks.0.conv1`` ...), so
timm's ``vit_*_r50_*`` weights load directly.

:class:`ConvTokenizer` is another CNN stem, the convolutional tokenizer of the Compact Convolutional Transformer
(Hassani et al. 2021, "Escaping the Big Data Paradigm with Compact Transformers", Sec. 3): a few 3x3
convolutions, each followed by ReLU and an overlapping 3x3/2 max-pool, whose last feature map's cells are the tokens.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError

__all__ = [
    "ConvTokenizer",
    "GroupNormAct",
    "HybridEmbed",
    "ResNetStem",
    "ResNetV2",
    "StdConv2d",
    "conv_stem_macs",
    "same_pad_amount",
]


def same_pad_amount(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after) for one axis: output = ceil(size / stride)."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _pad_same(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    top, bottom = same_pad_amount(x.shape[-2], kernel, stride)
    left, right = same_pad_amount(x.shape[-1], kernel, stride)
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


class StdConv2d(nn.Conv2d):
    """Convolution with weight standardisation (Qiao et al., 2019) and 'SAME' padding.

    Each output filter is normalised to zero mean and unit variance before use,
    as in BiT; ``eps`` 1e-8 matches the released hybrid checkpoints.
    """

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int, *, stride: int = 1, eps: float = 1e-8) -> None:
        super().__init__(in_chs, out_chs, kernel_size, stride=stride, padding=0, bias=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        flat = w.reshape(w.shape[0], -1)
        mean = flat.mean(dim=1, keepdim=True)
        var = flat.var(dim=1, unbiased=False, keepdim=True)
        w = ((flat - mean) / torch.sqrt(var + self.eps)).reshape_as(w)
        k, s = self.kernel_size[0], self.stride[0]
        return F.conv2d(_pad_same(x, k, s), w, None, self.stride)


class GroupNormAct(nn.GroupNorm):
    """GroupNorm with 32 groups, optionally followed by ReLU (BiT's norm layer)."""

    def __init__(self, channels: int, *, act: bool = True, groups: int = 32, eps: float = 1e-5) -> None:
        super().__init__(groups, channels, eps=eps)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = super().forward(x)
        return F.relu(x) if self.act else x


class ResNetStem(nn.Module):
    """7x7/2 standardised conv, GroupNorm + ReLU, 3x3/2 max-pool ('SAME'): stride 4."""

    def __init__(self, *, in_chans: int, out_chs: int = 64) -> None:
        super().__init__()
        self.conv = StdConv2d(in_chans, out_chs, 7, stride=2)
        self.norm = GroupNormAct(out_chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x))
        return F.max_pool2d(_pad_same(x, 3, 2, value=float("-inf")), 3, 2)


class DownsampleConv(nn.Module):
    """Projection shortcut: 1x1 standardised conv + GroupNorm (no activation)."""

    def __init__(self, in_chs: int, out_chs: int, *, stride: int) -> None:
        super().__init__()
        self.conv = StdConv2d(in_chs, out_chs, 1, stride=stride)
        self.norm = GroupNormAct(out_chs, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """Post-activation bottleneck unit (1x1, 3x3/stride, 1x1), ReLU after the sum."""

    def __init__(self, in_chs: int, out_chs: int, *, stride: int, project: bool) -> None:
        super().__init__()
        mid = out_chs // 4
        self.downsample = DownsampleConv(in_chs, out_chs, stride=stride) if project else None
        self.conv1 = StdConv2d(in_chs, mid, 1)
        self.norm1 = GroupNormAct(mid)
        self.conv2 = StdConv2d(mid, mid, 3, stride=stride)
        self.norm2 = GroupNormAct(mid)
        self.conv3 = StdConv2d(mid, out_chs, 1)
        self.norm3 = GroupNormAct(out_chs, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        x = self.norm1(self.conv1(x))
        x = self.norm2(self.conv2(x))
        x = self.norm3(self.conv3(x))
        return F.relu(x + shortcut)


class ResNetStage(nn.Module):
    def __init__(self, in_chs: int, out_chs: int, *, depth: int, stride: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(
            *(
                Bottleneck(in_chs if i == 0 else out_chs, out_chs, stride=stride if i == 0 else 1, project=i == 0)
                for i in range(depth)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2(nn.Module):
    """BiT ResNet without head: stem, then stages of widths 256, 512, 1024, 2048.

    ``layers=(3, 4, 9)`` is the paper's R50 variant for ViT (stage 4 removed,
    stage 3 extended to 9 units, Sec. 4.1 "Model Variants"), output stride 16.
    """

    def __init__(self, *, layers: tuple[int, ...], in_chans: int = 3) -> None:
        super().__init__()
        self.stem = ResNetStem(in_chans=in_chans)
        chs, stages = 64, []
        for i, depth in enumerate(layers):
            out = 256 * 2**i
            stages.append(ResNetStage(chs, out, depth=depth, stride=1 if i == 0 else 2))
            chs = out
        self.stages = nn.Sequential(*stages)
        self.num_features = chs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


class HybridEmbed(nn.Module):
    """CNN feature map -> P x P patches (1x1 in the paper) -> width D.

    ``layers=()`` keeps only the ResNet stem (timm's ``vit_*_r_s16_p8``),
    whose parameters then sit directly under ``backbone``.
    """

    def __init__(self, *, layers: tuple[int, ...], patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.layers = tuple(layers)
        self.in_chans = in_chans
        self.patch_size = patch_size
        if self.layers:
            self.backbone: nn.Module = ResNetV2(layers=self.layers, in_chans=in_chans)
            feat = self.backbone.num_features
        else:
            self.backbone = ResNetStem(in_chans=in_chans)
            feat = 64
        self.proj = nn.Conv2d(feat, embed_dim, kernel_size=patch_size, stride=patch_size)

    @property
    def stride(self) -> int:
        """Backbone output stride: 4 for the stem, halved again by every stage after the first."""
        return 4 * 2 ** max(len(self.layers) - 1, 0)

    def feature_size(self, height: int, width: int) -> tuple[int, int]:
        h, w = height, width
        for _ in range(2 + max(len(self.layers) - 1, 0)):  # every stride-2 op uses SAME padding: ceil
            h, w = math.ceil(h / 2), math.ceil(w / 2)
        return h, w

    def grid(self, height: int, width: int) -> tuple[int, int]:
        fh, fw = self.feature_size(height, width)
        return fh // self.patch_size, fw // self.patch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise InputError(
                f"the model takes {self.in_chans}-channel images of shape (B, C, H, W), got shape {tuple(x.shape)}"
            )
        return self.proj(self.backbone(x)).flatten(2).transpose(1, 2)


class ConvTokenizer(nn.Module):
    """CCT's convolutional tokenizer: ``layers`` times [3x3 convolution (stride 1, padding 1, no bias), ReLU,
    3x3 max-pool of stride 2 and padding 1], widths ``in_chans -> width ... -> embed_dim``; ``(B, C, H, W)`` ->
    ``(B, ceil(H / 2**layers) * ceil(W / 2**layers), embed_dim)``, one token per cell of the last feature map.

    Unlike Eq. 1's patches the receptive fields overlap, and the tokens carry the convolutions' inductive bias
    (CCT, Sec. 3.3). The convolutions are ``convs.0``, ``convs.1`` ..., initialised Kaiming-normal as in CCT; the
    first can be whitened instead (:func:`~.whiten.whiten_init_`)."""

    def __init__(self, *, layers: int, width: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.in_chans = in_chans
        self.layers = layers
        widths = [in_chans] + [width] * (layers - 1) + [embed_dim]
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, kernel_size=3, stride=1, padding=1, bias=False) for a, b in itertools.pairwise(widths)
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for conv in self.convs:
            nn.init.kaiming_normal_(conv.weight)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """The token grid (rows, columns): each max-pool gives ``ceil(side / 2)``."""
        s = 2**self.layers
        return -(-height // s), -(-width // s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise InputError(
                f"the model takes {self.in_chans}-channel images of shape (B, C, H, W), got shape {tuple(x.shape)}"
            )
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), kernel_size=3, stride=2, padding=1)
        return x.flatten(2).transpose(1, 2)


def conv_stem_macs(
    *, layers: int, width: int, in_chans: int, embed_dim: int, height: int, width_px: int
) -> tuple[int, tuple[int, int]]:
    """Multiply-accumulates of :class:`ConvTokenizer`'s convolutions and its token grid ``(rows, columns)``."""
    h, w, macs = height, width_px, 0
    widths = [in_chans] + [width] * (layers - 1) + [embed_dim]
    for a, b in itertools.pairwise(widths):
        macs += h * w * a * b * 9  # stride 1, padding 1: the conv keeps the size; the pool then halves it (ceil)
        h, w = -(-h // 2), -(-w // 2)
    return macs, (h, w)


def backbone_macs(
    layers: tuple[int, ...], *, in_chans: int, height: int, width: int
) -> tuple[int, int, tuple[int, int]]:
    """Multiply-accumulates of the ResNet: ``(macs, output channels, output (h, w))``."""
    h, w = math.ceil(height / 2), math.ceil(width / 2)
    macs = h * w * 64 * in_chans * 49  # 7x7/2 stem conv
    h, w = math.ceil(h / 2), math.ceil(w / 2)  # max-pool
    chs = 64
    for i, depth in enumerate(layers):
        out, stride = 256 * 2**i, 1 if i == 0 else 2
        for j in range(depth):
            mid, cin = out // 4, chs if j == 0 else out
            ho, wo = (math.ceil(h / stride), math.ceil(w / stride)) if j == 0 else (h, w)
            macs += h * w * cin * mid + ho * wo * mid * mid * 9 + ho * wo * mid * out
            if j == 0:
                macs += ho * wo * cin * out
            h, w = ho, wo
        chs = out
    return macs, chs, (h, w)
