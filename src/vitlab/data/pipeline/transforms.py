"""Augmentation and preprocessing with torchvision.transforms.v2, on uint8 tensors.

Train: random resized crop, horizontal flip, RandAugment, normalise, random erasing
(per image), then MixUp / CutMix (per batch). Eval: resize (bicubic, PIL's) + center crop, normalise:
timm's evaluation transform for a ViT, which the decode cache also follows.
Normalisation uses the model's ``mean``/``std`` (0.5/0.5 for Google weights, ImageNet
statistics for timm/DeiT-style ones), stored in the model's config.

Images may differ in size and aspect ratio (a folder of photos is stored so): the crop comes first and
gives every image the model's size, so everything after it works at the training size, and batches
are collated after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from ..images.decode import match_channels
from ..images.resize import resize_side, resized_shape

__all__ = ["ArrayDataset", "channel_stats", "eval_transform", "mix_transform", "train_transform"]


def _normalize(mean: Sequence[float], std: Sequence[float], in_chans: int) -> list[Callable]:
    mean, std = list(mean)[:in_chans], list(std)[:in_chans]
    if len(mean) < in_chans:  # e.g. a 3-value mean for a 4-channel model: repeat the last
        mean += [mean[-1]] * (in_chans - len(mean))
        std += [std[-1]] * (in_chans - len(std))
    return [_Normalize(mean, std)]


class _Normalize:
    """``v2.ToDtype(torch.float32, scale=True)`` then ``v2.Normalize(mean, std)`` on an image tensor, through
    the same two kernels (the same pixels) without the two transforms' per-call input inspection, which
    costs more than the arithmetic on an image at a small training size."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        self.mean, self.std = mean, std

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return F.normalize(F.to_dtype(image, torch.float32, scale=True), mean=self.mean, std=self.std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mean={self.mean}, std={self.std})"


class _Flip:
    """``v2.RandomHorizontalFlip(p)`` for one image tensor: the same draw (``torch.rand(1) >= p`` keeps the
    image) and the same kernel, without the transform's per-call input inspection."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image if torch.rand(1) >= self.p else F.horizontal_flip(image)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"


def channel_stats(
    images: np.ndarray | Sequence[np.ndarray], *, in_chans: int, rows: int = 2048
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation (on the 0-1 scale) of uint8 ``(N, H, W, C)`` images as the
    model sees them (channels matched to ``in_chans``), from ``rows`` evenly spaced images, read in chunks of
    at most 256 images and about 32 MiB once in float64, so that a memory-mapped split is never loaded whole.
    Images of several sizes (:class:`~vitlab.data.images.rows.PackedImages`) are read one at a time. The usual
    normalisation for training from scratch (the CIFAR scripts of timm and DeiT)."""
    n = len(images)
    if n == 0:
        raise ValueError("channel_stats: no images")
    idx = np.unique(np.linspace(0, n - 1, num=min(n, rows)).round().astype(np.int64))
    total = torch.zeros(in_chans, dtype=torch.float64)
    squares = torch.zeros(in_chans, dtype=torch.float64)
    count = 0
    shape = getattr(images, "shape", None)
    if shape is None:  # a list of arrays: 256 at a time when they share a shape, else one at a time
        per = 256 if len({np.shape(images[int(i)]) for i in idx}) == 1 else 1
    elif None in shape[1:3]:  # images of several sizes
        per = 1
    else:
        per = max(1, min(256, (32 << 20) // max(1, 8 * in_chans * int(np.prod(shape[1:3])))))
    for lo in range(0, len(idx), per):
        chunk = torch.from_numpy(np.stack([np.asarray(images[int(i)]) for i in idx[lo : lo + per]]))
        x = match_channels(chunk.permute(0, 3, 1, 2), in_chans).to(torch.float64) / 255.0
        total += x.sum(dim=(0, 2, 3))
        squares += x.square().sum(dim=(0, 2, 3))
        count += x.numel() // in_chans
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(0).sqrt().clamp_min(1e-3)  # a constant channel: no blow-up
    return tuple(round(float(v), 4) for v in mean), tuple(round(float(v), 4) for v in std)


def train_transform(
    *,
    img_size: int | tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    in_chans: int = 3,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    hflip: float = 0.5,
    randaugment: tuple[int, int] | None = None,
    random_erasing: float = 0.0,
    crop: bool = True,
    crop_pct: float = 1.0,
) -> v2.Compose:
    """Per-image training augmentation (Inception crop as in the paper's pre-training, plus the
    DeiT-style RandAugment and random erasing used for training from scratch on small data).
    The crop (RandomResizedCrop) is drawn on the image as stored, at its own aspect ratio, and
    gives the model's size; the other augmentations then work at that size.
    ``crop_scale=(1, 1)`` is "no crop": RandomResizedCrop then takes the largest centred box within
    ``crop_ratio`` (a square image whole, a non-square one its centre square). With ``crop_pct < 1``
    (photos, evaluated with timm's resize + centre crop) it is instead exactly the evaluation's view:
    the shorter side resized to ``img_size / crop_pct``, then the centre ``img_size`` square.
    ``crop=False``: everything after the crop, for a reader that crops as it decodes
    (:class:`~vitlab.data.shards.stream.TrainDecode`)."""
    t: list[Callable] = []
    if crop and tuple(crop_scale) == (1.0, 1.0) and crop_pct < 1 and _square(img_size):
        t += _resize_crop(img_size, crop_pct)
    elif crop:
        t.append(v2.RandomResizedCrop(img_size, scale=crop_scale, ratio=crop_ratio, antialias=True))
    if hflip > 0:
        t.append(_Flip(hflip))
    if randaugment is not None:
        t.append(v2.RandAugment(num_ops=randaugment[0], magnitude=randaugment[1]))
    t += _normalize(mean, std, in_chans)
    if random_erasing > 0:
        t.append(v2.RandomErasing(random_erasing, value=0))
    return v2.Compose(t)


def eval_transform(
    *,
    img_size: int | tuple[int, int],
    mean: Sequence[float],
    std: Sequence[float],
    in_chans: int = 3,
    crop_pct: float = 1.0,
) -> v2.Compose:
    """Resize (shorter side to ``floor(img_size / crop_pct)``, bicubic) + center crop + normalise: timm's
    evaluation transform for a ViT (``resolve_data_config`` + ``create_transform`` of the model's
    ``pretrained_cfg``), for images of any size and aspect ratio; the one evaluation resize of vitlab.

    Takes a PIL image (resized and cropped by PIL, as timm's transform does) or a ``(C, H, W)`` tensor. A uint8
    tensor of 1 or 3 channels is resized as a PIL image too, so every evaluation input gets PIL's pixels
    (torch's own uint8 bicubic differs from PIL's by a level here and there); other tensors (float, batches,
    other channel counts) are resized by torch. ``crop_pct=1`` (the default here) resizes the shorter side
    straight to the model's resolution, which is what fine-tuning at a higher resolution than the data needs.
    An image already of the resized size (the decode cache stores evaluation images so, and CIFAR-10 or the
    digits are stored at the model's size) is not resized at all: only its centre is taken. A non-square
    ``img_size`` is resized to (``img_size / crop_pct``) whatever the image's aspect ratio (timm's ``squash``).
    Returns a plain float tensor; channels are the caller's (:func:`~vitlab.data.images.decode.match_channels`)."""
    return v2.Compose(
        [
            *_resize_crop(img_size, crop_pct),
            v2.ToImage(),
            *_normalize(mean, std, in_chans),
            v2.ToPureTensor(),
        ]
    )


def _square(img_size: int | Sequence[int]) -> bool:
    return isinstance(img_size, int) or img_size[0] == img_size[1]


def _resize_crop(img_size: int | Sequence[int], crop_pct: float) -> list[Callable]:
    """Resize (shorter side to ``img_size / crop_pct``; both sides for a non-square size), centre crop."""
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    resize = [resize_side(s, crop_pct) for s in size]
    shorter = resize[:1] if _square(size) else resize  # one value: the shorter side, the aspect ratio kept
    return [_Resize(shorter), v2.CenterCrop(size)]


def resize_image(image: Any, size: tuple[int, int]) -> Any:
    """``image`` (PIL, or a ``(C, H, W)`` tensor) resized to exactly ``size`` ``(height, width)`` by the
    evaluation's rule (:class:`_Resize`: bicubic, antialiased, PIL's pixels for uint8 images), for callers that
    choose their own shape (NaViT's native-aspect grids, :mod:`vitlab.data.pipeline.navit`)."""
    return _Resize([int(size[0]), int(size[1])])(image)


class _Resize:
    """``v2.Resize(size)``, bicubic and antialiased, with a uint8 ``(C, H, W)`` CPU tensor of 1 or 3 channels
    resized as a PIL image (PIL's bicubic, what timm's transform and the decode cache use), and an image of the
    resized size returned as it is."""

    def __init__(self, size: list[int]) -> None:
        self.size = list(size)
        self.resize = v2.Resize(self.size, interpolation=v2.InterpolationMode.BICUBIC, antialias=True)

    def __call__(self, image: Any) -> Any:
        if not isinstance(image, torch.Tensor) or image.ndim != 3:
            return self.resize(image)  # a PIL image, or a batch
        h, w = image.shape[-2:]
        if len(self.size) == 1:
            w_to, h_to = resized_shape(w, h, self.size[0])
        else:
            h_to, w_to = self.size
        if (h_to, w_to) == (h, w):
            return image
        if image.dtype == torch.uint8 and image.shape[0] in (1, 3) and image.device.type == "cpu":
            return F.pil_to_tensor(self.resize(F.to_pil_image(image)))
        return self.resize(image)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, interpolation=bicubic)"


def mix_transform(*, num_classes: int, mixup: float = 0.0, cutmix: float = 0.0) -> Callable | None:
    """MixUp (Zhang et al., 2018) and/or CutMix (Yun et al., 2019) on a batch, one of the two
    picked at random per batch; ``None`` when both alphas are 0. Labels become soft targets."""
    ts = []
    if mixup > 0:
        ts.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
    if cutmix > 0:
        ts.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
    if not ts:
        return None
    return ts[0] if len(ts) == 1 else v2.RandomChoice(ts)


class ArrayDataset(Dataset):
    """A map-style dataset over uint8 ``(N, H, W, C)`` images (a memmap is fine), or images of several
    sizes (:class:`~vitlab.data.images.rows.PackedImages`, or a list): item ``i`` is ``(transform(CHW uint8
    tensor), label)``; the transform must give every image one size for a batch to be collated."""

    def __init__(
        self, images: np.ndarray, labels: np.ndarray, *, transform: Callable | None = None, in_chans: int | None = None
    ) -> None:
        self.images, self.labels, self.transform, self.in_chans = images, labels, transform, in_chans

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = torch.from_numpy(np.array(self.images[i], copy=True)).permute(2, 0, 1)
        if self.in_chans is not None:
            x = match_channels(x, self.in_chans)
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.labels[i])
