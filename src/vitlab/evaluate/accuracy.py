"""Top-1 / top-5 / per-class accuracy and the confusion matrix, and the one path from image
files to a model's evaluation inputs (``vitlab eval``, ``fewshot`` and ``predict`` share it)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.images.resize import resize_side
from ..devices import autocast, resolve_device
from ..errors import CheckpointError, ConfigError, InputError
from .calibration import LogitKeeper, Reliability, model_temperature, probabilities

if TYPE_CHECKING:
    from ..data import ArrayDataset
    from ..data.sources import FolderStorage

__all__ = [
    "DENSE_CONFUSION_BYTES",
    "TTA_MODES",
    "decode_crop",
    "decode_size",
    "eval_dataset",
    "evaluate_batches",
    "evaluate_model",
    "model_inputs",
    "preprocess_for",
    "training_storage",
    "transforms_for",
    "tta_logits",
]


DENSE_CONFUSION_BYTES = 64 << 20
"""Largest confusion matrix kept as a dense array (64 MiB of int64 counts: up to 2,896 classes). Beyond it
only the non-zero cells are counted (at most one per image evaluated): ImageNet-21k's 21,843 classes would
take 3.8 GB dense."""


TTA_MODES = ("flip",)
"""Test-time augmentations :func:`tta_logits` knows (``vitlab eval --tta``)."""


def tta_logits(model: nn.Module, x: torch.Tensor, tta: str | None = None) -> torch.Tensor:
    """``model``'s float logits for the image batch ``x`` ``(B, C, H, W)``; with ``tta="flip"`` the mean of the
    logits of ``x`` and of its horizontal mirror (test-time flip augmentation, as the CIFAR-10 speed records
    evaluate: airbench's ``tta_level=1``). The logits are averaged, not the softmax probabilities, so the loss
    reported is that of the averaged logits; a model whose logits are mirror-symmetric gives what it gives alone."""
    _check_tta(tta)
    logits = model(x).float()
    if tta == "flip":
        logits = (logits + model(x.flip(-1)).float()) / 2
    return logits


def _check_tta(tta: str | None) -> None:
    if tta is not None and tta not in TTA_MODES:
        raise ConfigError(f"tta: {tta!r} is not one of {', '.join(TTA_MODES)} (or none)")


@torch.no_grad()
def evaluate_batches(
    model: nn.Module,
    batches,
    *,
    num_classes: int,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    dist=None,
    tta: str | None = None,
    finite: bool = False,
    temperature: float | None = None,
    keep_logits: bool = False,
) -> dict[str, Any]:
    """Top-1, top-5, mean loss, per-class accuracy and image counts, and the confusion matrix (rows: true
    class) over ``(images, labels)`` batches. In DDP each rank passes its own shard; counts are summed.
    ``tta="flip"``: the logits of each image averaged with its mirror's (:func:`tta_logits`). ``finite``: NaN or
    infinite logits are an error (``vitlab eval``: a model whose outputs are NaN has no accuracy to report).

    ``temperature`` (the model's, :func:`~vitlab.evaluate.calibration.model_temperature`): also the expected
    calibration error of ``softmax(logits / temperature)`` (``ece``, the probabilities ``vitlab predict`` gives) and
    of ``softmax(logits)`` (``ece_uncalibrated``), with the reliability diagram of the first (``reliability``).
    ``keep_logits``: also ``logits`` and ``labels``, CPU tensors in the evaluation's order (every rank's, rank 0's
    first), within :data:`~vitlab.evaluate.calibration.MAX_KEPT_LOGITS` values
    (:class:`~vitlab.evaluate.calibration.LogitKeeper`): what a run fits its temperature on.

    Memory is O(classes) besides the confusion matrix, which is ``confusion`` (a dense array) when it fits
    in :data:`DENSE_CONFUSION_BYTES`, else ``confusion_cells`` (``(k, 3)`` rows ``true, predicted, count`` of
    its non-zero cells, at most one per image); no batch allocates more than its own size."""
    _check_tta(tta)
    model.eval()
    c = num_classes
    dense = c * c * 8 <= DENSE_CONFUSION_BYTES
    conf = torch.zeros(c * c if dense else 0, dtype=torch.int64)
    cells: dict[int, int] = {}
    total = torch.zeros(c, dtype=torch.int64)
    correct = torch.zeros(c, dtype=torch.int64)
    top5 = torch.zeros((), dtype=torch.int64)
    loss = torch.zeros((), dtype=torch.float64)
    rel = (Reliability(), Reliability()) if temperature is not None else None  # calibrated, uncalibrated
    kept = LogitKeeper() if keep_logits else None
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, amp_dtype):
            logits = tta_logits(model, x, tta)
        if finite and not bool(torch.isfinite(logits).all()):
            bad = int((~torch.isfinite(logits)).any(1).sum())
            raise CheckpointError(
                f"the model's outputs hold NaN or infinite values ({bad} of {len(logits)} images of a batch); "
                "it has no accuracy to report (its weights, or an exported graph, are broken)"
            )
        loss += F.cross_entropy(logits, y, reduction="sum").double().cpu()
        if rel is not None:
            rel[0].add(probabilities(logits, temperature), y)  # type: ignore[arg-type]
            rel[1].add(probabilities(logits), y)
        if kept is not None:
            kept.add(logits, y)
        top5 += (logits.topk(min(5, logits.shape[1]), dim=1).indices == y[:, None]).any(1).sum().cpu()
        pred = logits.argmax(1).clamp(max=c - 1).cpu()
        y = y.cpu().long()
        total.index_add_(0, y, torch.ones_like(y))
        correct.index_add_(0, y, (pred == y).long())
        if dense:
            conf.index_add_(0, y * c + pred, torch.ones_like(y))
        else:
            keys, counts = torch.unique(y * c + pred, return_counts=True)
            for k, n in zip(keys.tolist(), counts.tolist(), strict=True):
                cells[k] = cells.get(k, 0) + n
    if dist is not None and dist.enabled:
        import torch.distributed as tdist

        for t in (conf, total, correct, top5, loss):
            tdist.all_reduce(t)
        if rel is not None:
            for r in rel:
                t = r.tensor()
                tdist.all_reduce(t)
                r.load(t)
        if kept is not None:
            parts: list[Any] = [None] * dist.world_size
            tdist.all_gather_object(parts, kept.result())
            gathered_logits = torch.cat([p[0] for p in parts if len(p[0])] or [torch.zeros(0, c)])
            gathered_labels = torch.cat([p[1] for p in parts])
        if not dense:
            gathered: list[dict[int, int]] = [{} for _ in range(dist.world_size)]
            tdist.all_gather_object(gathered, cells)
            cells = {}
            for part in gathered:
                for k, n in part.items():
                    cells[k] = cells.get(k, 0) + n
    n = int(total.sum())
    res: dict[str, Any] = {
        "top1": float(correct.sum()) / max(n, 1),
        "top5": float(top5) / max(n, 1),
        "loss": float(loss) / max(n, 1),
        "count": n,
        "per_class": (correct.double() / total.clamp(min=1).double()).tolist(),
        "class_counts": total.tolist(),
    }
    if rel is not None:
        res.update(ece=rel[0].ece(), ece_uncalibrated=rel[1].ece(), temperature=temperature,
                   reliability=rel[0].to_dict())  # fmt: skip
    if kept is not None:
        if dist is not None and dist.enabled:
            res["logits"], res["labels"] = gathered_logits, gathered_labels
        else:
            res["logits"], res["labels"] = kept.result()
    if dense:
        res["confusion"] = conf.view(c, c).numpy()
    else:
        keys = np.asarray(sorted(cells), dtype=np.int64)
        counts = np.asarray([cells[k] for k in keys.tolist()], dtype=np.int64)
        res["confusion_cells"] = np.stack([keys // c, keys % c, counts], axis=1)
    return res


def preprocess_for(model: nn.Module):
    """The evaluation transform a vitlab model's config asks for (:func:`vitlab.data.eval_transform`): timm's
    convention, the shorter side resized (bicubic) to its resolution over its ``crop_pct``, the centre crop at its
    resolution, its mean/std; what ``timm.data.create_transform`` makes of its ``pretrained_cfg``."""
    from ..data import eval_transform

    cfg = model.config
    return eval_transform(
        img_size=cfg.img_size,
        mean=cfg.mean,
        std=cfg.std,
        in_chans=cfg.in_chans,
        crop_pct=cfg.crop_pct,
    )


def transforms_for(model: nn.Module, *, training: bool = False):
    """The preprocessing of ``model`` for plain PyTorch: a ``torchvision.transforms.v2`` pipeline from an image file's
    path, a PIL image, a ``(H, W, C)`` uint8 array or a ``(C, H, W)`` uint8 tensor (a float one in [0, 1] too) to
    the normalised float tensor the model takes.

    Evaluation (default): :func:`preprocess_for`, the transform of ``vitlab eval``, after what vitlab's decoder does to
    a file (:func:`~vitlab.data.images.decode.decode_image`): a path is decoded by it, and a PIL image is treated as it
    treats the file it opened (:func:`~vitlab.data.images.decode.decode_pil`: turned as its EXIF orientation tag says,
    transparency composited on white, 16-bit scaled, ``L`` for a one-channel model), so ``transforms_for(model)(path)``
    and ``transforms_for(model)(Image.open(path))`` are the pixels ``vitlab predict path`` feeds the model: a phone's
    portrait stands upright, a transparent PNG lies on white. A PIL image stays one until after the crop: PIL resizes it
    (bicubic) and crops it, so the result equals ``timm.data.create_transform(**timm.data.resolve_data_config({},
    model=model))`` of the same (turned, RGB) image. A uint8 array or tensor of 1 or 3 channels is taken as already
    decoded and resized as a PIL image too (the same pixels), and one with an alpha channel (``np.asarray`` of an ``LA``
    or ``RGBA`` PNG) is laid on white first, and a uint16 one scaled to 8 bits, as their files would be; a float tensor
    is resized by torch (bicubic, antialiased), which may differ from PIL by about one grey level where it resizes. An
    image without pixels is refused. ``training=True``: the paper's Inception crop and a horizontal flip
    (:func:`vitlab.data.train_transform`'s defaults, no RandAugment). Channels are matched to the model as vitlab's
    decoder does (grey repeated, RGB to luma for one channel)."""
    from torchvision.transforms import v2

    from ..data import train_transform

    cfg = model.config
    if training:
        tf = train_transform(img_size=cfg.img_size, mean=cfg.mean, std=cfg.std, in_chans=cfg.in_chans)
        return v2.Compose([_ModelChannels(cfg.in_chans, keep_pil=False), *tf.transforms, v2.ToPureTensor()])
    return v2.Compose([_ModelChannels(cfg.in_chans, keep_pil=True), *preprocess_for(model).transforms])


class _ModelChannels:
    """Any image :func:`transforms_for` takes -> the model's channel count, by the decoder's rule: a uint8
    ``(C, H, W)`` tensor, or with ``keep_pil`` a PIL image in ``L`` (a one-channel model) or ``RGB`` (three). A
    path is decoded by the one decoder; a PIL image is turned and converted as it turns and converts a file."""

    def __init__(self, in_chans: int, *, keep_pil: bool) -> None:
        self.in_chans, self.keep_pil = in_chans, keep_pil

    def __call__(self, image: Any) -> Any:
        from PIL import Image
        from torchvision.transforms import v2

        from ..data.images.decode import decode_pil, match_channels
        from ..data.images.user_files import read_image

        if isinstance(image, (str, os.PathLike)):
            image = read_image(image).copy()  # the one decoder: EXIF orientation, transparency on white, RGB
        image = _as_pil(image)  # np.asarray(Image.open(png)) of RGBA, LA or 16 bits: as its file would be
        if isinstance(image, Image.Image):
            if not image.width or not image.height:
                raise InputError(f"an image of {image.width} x {image.height} pixels has nothing to resize")
            grey = image.mode in ("1", "L", "LA", "La", "I", "F") or image.mode.startswith("I;")
            image = decode_pil(image, "L" if self.in_chans == 1 or (grey and self.in_chans != 3) else "RGB")
            if self.keep_pil and self.in_chans in (1, 3):
                return image
        elif isinstance(image, np.ndarray) and not image.flags.writeable:  # np.asarray(Image.open(p)) is read-only:
            image = image.copy()  # torch.from_numpy would warn of undefined behaviour, to a user who did nothing wrong
        x = v2.ToImage()(image).as_subclass(torch.Tensor)
        if not x.shape[-1] or not x.shape[-2]:
            raise InputError(f"an image of {x.shape[-1]} x {x.shape[-2]} pixels has nothing to resize")
        return match_channels(x, self.in_chans)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(in_chans={self.in_chans})"


def _as_pil(image: Any) -> Any:
    """An unbatched image array that PIL's own modes describe as the decoder's rule needs them, as that PIL
    image, so that the decoder converts it as it converts the file: a uint8 ``(H, W, 2 or 4)`` array or
    ``(2 or 4, H, W)`` tensor with an alpha channel (``np.asarray`` of an ``LA`` or ``RGBA`` PNG, composited on
    white) and a ``(H, W)`` uint16 array (of an ``I;16`` PNG, scaled to 8 bits); anything else as it is."""
    from PIL import Image

    if isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.ndim == 3 and image.shape[0] in (2, 4):
        image = image.permute(1, 2, 0).numpy(force=True)
    if not isinstance(image, np.ndarray) or not all(image.shape):
        return image
    if (image.dtype == np.uint16 and image.ndim == 2) or (image.dtype == np.uint8 and image.shape[2:] in ((2,), (4,))):
        return Image.fromarray(np.ascontiguousarray(image))  # (PIL reads I;16, LA or RGBA from the shape and type)
    return image


def decode_size(model: nn.Module) -> int:
    """The square side a folder is decoded to for evaluating ``model`` (the decode cache's ``size``): for a
    square model exactly its resolution over its ``crop_pct``, the side :func:`preprocess_for` resizes the
    shorter side to, so the stored squares are ready and evaluation only takes their centre (the transform's
    resize finds the size already right and does nothing); for a non-square one the longer side over
    ``crop_pct`` and 0.875 (a margin the transform then resizes away), at least 32. ``vitlab eval`` and
    ``vitlab fewshot`` both decode at it, so one image file gives both the same pixels."""
    cfg = model.config
    crop_pct = cfg.crop_pct
    h, w = cfg.img_size
    if h == w:
        return resize_side(h, crop_pct)
    return max(32, round(max(h, w) / crop_pct / 0.875))


def decode_crop(model: nn.Module) -> int | None:
    """The centre crop the evaluation of ``model`` takes of the squares decoded at :func:`decode_size` (its
    resolution; ``load_data``'s ``crop``), so the decode stores every image resized and placed as timm's
    transform would take it; ``None`` for a non-square model (its transform resizes the squares again)."""
    h, w = model.config.img_size
    return h if h == w else None


def eval_dataset(model: nn.Module, images: np.ndarray | Sequence[np.ndarray], labels: np.ndarray) -> ArrayDataset:
    """Decoded uint8 ``(H, W, C)`` images as ``model``'s evaluation inputs: channels matched by
    :func:`~vitlab.data.images.decode.match_channels`, then :func:`preprocess_for` (resize, crop, normalise)."""
    from ..data import ArrayDataset

    return ArrayDataset(images, labels, transform=preprocess_for(model), in_chans=model.config.in_chans)


def model_inputs(model: nn.Module, images: np.ndarray | Sequence[np.ndarray]) -> torch.Tensor:
    """A ``(N, C, H, W)`` float batch of ``model``'s evaluation inputs for uint8 ``(H, W, C)`` images
    (of any sizes): the items of :func:`eval_dataset`, what ``vitlab eval`` feeds the model (images that need a
    resize are resized by PIL, as the decode cache and timm's transform resize them)."""
    ds = eval_dataset(model, images, np.zeros(len(images), dtype=np.int64))
    if not len(ds):
        h, w = model.config.img_size
        return torch.zeros(0, model.config.in_chans, h, w)
    return torch.stack([ds[i][0] for i in range(len(ds))])


def evaluate_model(
    model: nn.Module,
    data: str,
    *,
    split: str = "val",
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    val_split: float | None = None,
    cache_dir: str | None = None,
    strict: bool = False,
    progress: bool = True,
    buffer_bytes: int | None = None,
    allow_pipe: bool = False,
    tta: str | None = None,
) -> dict[str, Any]:
    """Accuracy of ``model`` on the evaluation (``val``) or ``train`` split of ``data``; ``tta="flip"``: with
    test-time flip augmentation (:func:`tta_logits`). Also the expected calibration error of the probabilities
    ``vitlab predict`` gives (``ece``: with the model's temperature, ``temperature``; 1 for a model without one) and
    of the raw softmax (``ece_uncalibrated``), over every image evaluated (:func:`evaluate_batches`).

    The evaluation split is the data's own (``val/`` or ``test/``), or with ``val_split`` the fraction held out of
    the training images (stratified, seed 0, as training holds it out); a folder with neither is evaluated whole
    (``split`` ``all`` in the result: nothing trains on it here, so nothing is held out).

    The data's class folders are matched to ``model.config.class_names`` by name, so a folder
    holding only some of the classes still evaluates correctly. ``buffer_bytes`` bounds the decoded
    images held in memory while a folder's decode cache is built (default 64 MiB, ``--memory-budget``).
    ``allow_pipe``: tar shards named by ``pipe:`` URLs (a shell command) are read (``--allow-pipe``)."""
    from torch.utils.data import DataLoader

    from .._progress import ProgressLog
    from ..data import DataError, load_data
    from ..data.sources import DataSource

    cfg = model.config
    dev = resolve_device(device)
    if DataSource.named(data).shards:
        return _evaluate_shards(
            model,
            data,
            split=split,
            batch_size=batch_size,
            device=dev,
            val_split=val_split,
            allow_pipe=allow_pipe,
            tta=tta,
        )
    stored = training_storage(model, data, val_split=val_split)
    how: dict[str, Any] = (
        {"size": decode_size(model), "crop": decode_crop(model), "val_split": val_split}
        if stored is None
        else {"storage": stored[0], "val_split": stored[1]}
    )
    splits = load_data(
        data,
        **how,
        cache_dir=cache_dir,
        strict=strict,
        progress=progress,
        buffer_bytes=buffer_bytes,
        eval_only=split != "train",
    )
    arr = splits.train if split == "train" else splits.val
    names = list(cfg.class_names or [str(i) for i in range(cfg.num_classes)])
    if names == splits.class_names:
        labels = arr.labels
    else:
        missing = [c for c in splits.class_names if c not in names]
        if missing:
            raise DataError(
                f"--data {data}: class(es) {', '.join(missing[:5])} unknown to the model "
                f"(it knows {', '.join(names[:10])} ...)"
            )
        remap = np.asarray([names.index(c) for c in splits.class_names])
        labels = remap[arr.labels]
    ds = eval_dataset(model, arr.images, labels)
    model.to(dev)
    loader = DataLoader(ds, batch_size=batch_size)
    log = ProgressLog(total=len(loader), desc="eval", unit="batch", enabled=progress, leave=False, every=0)
    batches = log.wrap(loader)
    res = evaluate_batches(model, batches, num_classes=len(names), device=dev, tta=tta, finite=True,
                           temperature=model_temperature(model))  # fmt: skip
    present = sorted(set(np.unique(labels).tolist()))
    res["per_class"] = {names[i]: res["per_class"][i] for i in present}
    res["class_names"] = names
    res["data"] = data
    res["split"] = splits.val_name if split != "train" else "train"
    res["skipped_files"] = [p for p, _ in splits.skipped]
    return res


def training_storage(
    model: nn.Module, data: str, *, val_split: float | None = None
) -> tuple[FolderStorage, float | None] | None:
    """``(storage, val_split)``: how the run that trained ``model`` stored the folder ``data`` (its ``model/`` records
    it: the folder's absolute path, ``data_storage``, ``data_plan`` in earlier models, and ``val_split``), so that the
    evaluation reads the decode cache training wrote, and the same pixels training evaluated, instead of decoding the
    split again; None for another folder, another ``val_split``, a model of another size, or no (valid) record. The
    record is data read from a file: it is only compared and checked
    (:meth:`~vitlab.data.images.storage.FolderStorage.from_record`)."""
    from ..data.sources import DEFAULT_HOLD_OUT, FolderStorage

    extra = model.config.extra or {}
    recorded, stored = extra.get("data"), FolderStorage.from_record(extra.get("data_storage", extra.get("data_plan")))
    saved = extra.get("val_split")
    if stored is None or not isinstance(recorded, str) or not (saved is None or type(saved) is float):
        return None
    if val_split is not None and val_split not in (saved, DEFAULT_HOLD_OUT if saved is None else saved):
        return None  # (no --val-split in training: a folder without val/ held out the default fraction)
    if stored.size is not None and tuple(stored.size) != tuple(model.config.img_size):
        return None
    try:
        same = Path(recorded).is_absolute() and Path(recorded).resolve() == Path(data).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    return (stored, saved if val_split is None else val_split) if same else None


def _evaluate_shards(
    model: nn.Module,
    data: str,
    *,
    split: str,
    batch_size: int,
    device: torch.device,
    val_split: float | None,
    allow_pipe: bool = False,
    tta: str | None = None,
) -> dict[str, Any]:
    """:func:`evaluate_model` on tar shards (:mod:`vitlab.data.shards.stream`): read and decoded as they are
    evaluated."""
    from torch.utils.data import DataLoader

    from ..data import DataError
    from ..data.shards.stream import EvalDecode, ShardStream, StreamBatches, open_stream_data

    cfg = model.config
    sd = open_stream_data(data, val_split=val_split, eval_only=split != "train", allow_pipe=allow_pipe)
    names = list(cfg.class_names or [str(i) for i in range(cfg.num_classes)])
    missing = [c for c in sd.class_names if c not in names]
    if missing:
        raise DataError(
            f"--data {data}: class(es) {', '.join(missing[:5])} unknown to the model "
            f"(it knows {', '.join(names[:10])} ...)"
        )
    ds = ShardStream(
        shards=sd.train if split == "train" else sd.val,
        transform=EvalDecode(in_chans=cfg.in_chans, tf=preprocess_for(model)),  # at full scale, as from a folder
        out_shape=(cfg.in_chans, *cfg.img_size),
        num_classes=len(names),
        shuffle=False,
        batch=batch_size,
        label_map=np.asarray([names.index(c) for c in sd.class_names], dtype=np.int64),
    )
    model.to(device)
    batches = StreamBatches(DataLoader(ds, batch_size=batch_size))
    res = evaluate_batches(model, batches, num_classes=len(names), device=device, tta=tta, finite=True,
                           temperature=model_temperature(model))  # fmt: skip
    present = [i for i, count in enumerate(res["class_counts"]) if count > 0]
    res["per_class"] = {names[i]: res["per_class"][i] for i in present}
    res.update(class_names=names, data=data, split=sd.val_name if split != "train" else "train", skipped_files=[])
    return res
