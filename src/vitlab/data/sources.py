"""Where images come from: the embedded digits, CIFAR through torchvision, or an ImageFolder.

Every source becomes a :class:`DataSplits` of uint8 ``(N, H, W, C)`` arrays with
integer labels and class names, so the training loop never touches files.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._text import shown
from ..errors import ConfigError, DataError, OfflineError
from .cache.store import DEFAULT_BUFFER_BYTES, decode_files
from .images.decode import header_sizes
from .images.rows import ImageRows, PackedImages
from .images.scan import labels_file_hint, readable, scan_classes
from .images.storage import FolderStorage
from .shards.source import is_shard_spec

__all__ = [
    "BUILTIN_DATA",
    "DEFAULT_HOLD_OUT",
    "EVAL_DIRS",
    "DataError",
    "DataSource",
    "DataSplits",
    "FolderStorage",
    "ImageArray",
    "builtin_data",
    "data_folder",
    "describe_splits",
    "digits_arrays",
    "eval_split_dir",
    "load_data",
    "stratified_split",
    "stratifies",
]

BUILTIN_DATA = ("digits", "cifar10", "cifar100")
"""The data sets ``--data`` names by a bare name. A name is always the data set, even where a folder of that name
exists here (the run's own ``--out digits``, say): a folder of that name is given as a path, ``./digits``."""
DEFAULT_HOLD_OUT = 0.1
"""The fraction of a folder without ``val/`` or ``test/`` a training run holds out for evaluation (``--val-split``)."""
HEADER_SAMPLE = 1024
"""Files of a training split whose headers decide a :class:`FolderStorage` (evenly spread; all of a smaller split)."""


@dataclass
class ImageArray:
    """One split: ``images`` ``(N, H, W, C)`` uint8 (an array, a memmap or an :class:`ImageRows`
    view of one), or images of several sizes (:class:`PackedImages`, a view of one), and ``labels``
    ``(N,)`` int64."""

    images: np.ndarray | PackedImages | ImageRows
    labels: np.ndarray
    files: list[str] | None = None
    """The file of each row, as the folder walk names it (a folder's splits; None for the built-in data sets): what
    the data check's findings are matched to (``--dedup-eval``)."""

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, idx: np.ndarray) -> ImageArray:
        """Rows ``idx`` (in sorted order) as a view: the images are not copied, so a split of a
        memory-mapped dataset larger than RAM stays on disk; the small labels (and file names) are copied."""
        idx = np.sort(np.asarray(idx, dtype=np.int64))
        files = [self.files[i] for i in idx.tolist()] if self.files is not None else None
        return ImageArray(ImageRows(self.images, idx), self.labels[idx], files)


@dataclass
class DataSplits:
    """Train and evaluation splits of one dataset."""

    name: str
    train: ImageArray
    val: ImageArray
    class_names: list[str]
    val_name: str = "test"
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """Files that could not be decoded: ``(path, reason)``."""
    cache_files: list[Path] = field(default_factory=list)
    """The decode cache files the splits are read from (a folder's; none for the built-in datasets)."""
    storage: FolderStorage | None = None
    """How a folder was stored for a run (``load_data(storage=...)``); ``None``: as the images are."""
    held_out: float | None = None
    """The fraction of a folder without ``val/`` or ``test/`` held out for evaluation (stratified); ``None``: the
    data's own evaluation split."""
    by_class: bool = True
    """Whether ``held_out`` was held out of each class (:func:`stratifies`), not at random."""
    left_alone: tuple[str, ...] = ()
    """The folder's other evaluation folders, beside the one evaluated (``test`` beside ``val``): kept for the end."""

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def in_chans(self) -> int:
        return int(self.train.images.shape[-1])

    @property
    def image_size(self) -> tuple[int, int]:
        """The resolution to train at: the storage's, else the images' own (one size), else the typical side."""
        if self.storage is not None and self.storage.size is not None:
            return self.storage.size
        h, w = self.train.images.shape[1:3]
        if h is None or w is None:
            side = self.storage.typical if self.storage is not None else 0
            return side, side
        return int(h), int(w)

    def describe(self) -> dict[str, object]:
        return describe_splits(self)


def builtin_data(spec: str) -> str | None:
    """The built-in data set a ``--data`` value names (:data:`BUILTIN_DATA`, any case, blanks around ignored), or
    None: then it is a path (a folder, tar shards) or a mistake."""
    key = str(spec).strip().lower()
    return key if key in BUILTIN_DATA else None


def data_folder(spec: str) -> Path | None:
    """The folder a ``--data`` value names, or None: a built-in name (:func:`builtin_data`) is never a folder, even
    where one of that name exists here. A run folder (``vitlab train --out``: ``last.pt``, or a model in ``model/``)
    is an output folder, never read as data: a :class:`DataError` in one line."""
    if builtin_data(spec) is not None:
        return None
    path = Path(str(spec)).expanduser()
    if not path.is_dir():
        return None
    model = path / "model"
    if (path / "last.pt").is_file() or ((model / "model.safetensors").is_file() and (model / "config.json").is_file()):
        raise DataError(
            f"--data {spec}: a run folder (vitlab train --out wrote it), not a data set; an output folder is never "
            "read as data: give the data's own folder"
        )
    return path


@dataclass(frozen=True)
class DataSource:
    """What a ``--data`` value names, told once (:func:`vitlab.train.fit` makes it at its top; the run's data
    fingerprint, data check, side probe, loading and split lines take it): tar shards
    (:func:`~vitlab.data.shards.source.is_shard_spec`), else the user's image folder (:func:`data_folder`; a run folder
    is refused there), else neither: a built-in data set, or a name :func:`load_data` refuses."""

    spec: str
    shards: bool = False
    folder: Path | None = None

    @classmethod
    def named(cls, spec: str) -> DataSource:
        if is_shard_spec(spec):
            return cls(spec=spec, shards=True)
        return cls(spec=spec, folder=data_folder(spec))

    @property
    def users(self) -> bool:
        """The user's own images (a folder, or tar shards), not a built-in data set."""
        return self.shards or self.folder is not None

    def check_out(self, out: str | os.PathLike[str]) -> None:
        """An output folder is never read as a data set: the data folder naming the run's ``out`` (or a folder inside
        it, or one holding it) is refused in one line, before anything is written. (A built-in name is the data set
        whatever folders exist, so ``--out digits`` trains on the digits.)"""
        if self.folder is None:
            return
        d, o = self.folder.resolve(), Path(out).expanduser().resolve()
        if d == o or o in d.parents:
            raise ConfigError(
                f"--data {shown(self.spec)}: the run's output folder (--out {shown(out)}) or a folder in it; an "
                "output folder is never read as data: give the data's own folder"
            )
        if d in o.parents:
            raise ConfigError(
                f"--out {shown(out)}: inside the data folder --data {shown(self.spec)}, where the run's files would be "
                "read as data (a class folder); choose an --out outside it"
            )


EVAL_DIRS = ("val", "valid", "validation", "test")
"""The names of a folder's own evaluation split, beside ``train/``, in the order one is looked for."""


def eval_split_dir(root: Path) -> Path | None:
    """The evaluation split folder of ``root`` (:data:`EVAL_DIRS`) when it also holds ``train/``, else None: a
    plain class folder, evaluated whole or by a held-out fraction."""
    if not (root / "train").is_dir():
        return None
    return next((root / n for n in EVAL_DIRS if (root / n).is_dir()), None)


def describe_splits(data: Any) -> dict[str, object]:
    """The summary of a data set that ``summary.json`` keeps, for :class:`DataSplits` and any object with its
    fields (the shard reader's :class:`~vitlab.data.shards.stream.StreamData`)."""
    h, w = data.image_size
    return {
        "name": data.name,
        "train": len(data.train),
        data.val_name: len(data.val),
        "classes": data.num_classes,
        "image_size": [h, w],
        "channels": data.in_chans,
        "skipped_files": len(data.skipped),
    }


def stratified_split(labels: np.ndarray, fraction: float, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified ``(train_idx, val_idx)``; ``fraction`` of each class goes to val. Stratified when
    every class has two images and each side has room for one of every class (else a plain random split: a small
    folder still trains, with the classes it could hold out); a side left empty is a one-line error."""
    from sklearn.model_selection import train_test_split

    if not 0.0 < fraction < 1.0:
        raise DataError(f"--val-split must be in (0, 1), got {fraction}")
    idx = np.arange(len(labels))
    n_val = math.ceil(fraction * len(labels))  # scikit-learn's count for a float test_size
    if not 0 < n_val < len(labels):
        raise DataError(
            f"--val-split {fraction:g} of {len(labels)} image(s) leaves no training or no evaluation image: "
            "add images, or a val/ folder"
        )
    stratify = labels if stratifies(labels, fraction) else None
    tr, va = train_test_split(idx, test_size=fraction, random_state=seed, stratify=stratify)
    return np.sort(tr), np.sort(va)


def stratifies(labels: np.ndarray, fraction: float) -> bool:
    """Whether :func:`stratified_split` holds ``fraction`` of each class out of ``labels``: every class has two
    images, and each side has room for one of every class; else its split is a plain random one."""
    counts = np.bincount(labels)
    n_val = math.ceil(fraction * len(labels))
    room = min(n_val, len(labels) - n_val) >= int((counts > 0).sum())
    return bool(len(labels)) and int(counts[counts > 0].min()) >= 2 and room


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 8x8 handwritten digits shipped with scikit-learn (UCI optdigits test set) as
    uint8 ``(N, 8, 8, 1)`` images (values 0-16 scaled to 0-255) and int64 labels, in file order."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return np.round(d.images * (255.0 / 16.0)).astype(np.uint8)[..., None], d.target.astype(np.int64)


def _digits(val_split: float | None) -> DataSplits:
    """:func:`digits_arrays` with a fixed stratified 80/20 split."""
    images, labels = digits_arrays()
    tr, va = stratified_split(labels, val_split or 0.2, seed=0)
    return DataSplits(
        "digits", ImageArray(images[tr], labels[tr]), ImageArray(images[va], labels[va]), [str(i) for i in range(10)]
    )


def _cifar(name: str, cache_dir: Path) -> DataSplits:
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    root = cache_dir / "torchvision"
    try:
        train = cls(str(root), train=True, download=True)
        test = cls(str(root), train=False, download=True)
    except Exception as e:  # no network: say what to do instead
        here = f"; the folder {name}/ here is given as --data ./{name}" if Path(name).is_dir() else ""
        raise OfflineError(
            f"{name}: could not download through torchvision into {root} ({type(e).__name__}); copy the "
            f"torchvision files there, or pass a local ImageFolder instead (--data path/to/{name}, holding "
            f"train/<class>/ and test/<class>/){here}"
        ) from None
    return DataSplits(
        name,
        ImageArray(np.asarray(train.data), np.asarray(train.targets, dtype=np.int64)),
        ImageArray(np.asarray(test.data), np.asarray(test.targets, dtype=np.int64)),
        list(train.classes),
    )


@dataclass(frozen=True)
class _Decode:
    """How a folder's files become the decode cache: the options of :func:`~vitlab.data.cache.store.decode_files`
    plus ``strict``, built once by :func:`load_data` and handed down unchanged."""

    size: int | None
    mode: str
    cache_dir: Path
    strict: bool
    workers: int
    progress: bool
    max_pixels: int | None
    buffer_bytes: int
    min_classes: int = 1
    storage: FolderStorage | Callable[..., FolderStorage] | None = None
    crop: int | None = None


def _header_counts(paths: list[str], limit: int = HEADER_SAMPLE) -> dict[tuple[int, int], int]:
    """``(width, height) -> count`` from the headers of up to ``limit`` of ``paths``, evenly spread."""
    idx = np.unique(np.linspace(0, len(paths) - 1, num=min(len(paths), limit)).round().astype(np.int64))
    counts: dict[tuple[int, int], int] = {}
    for wh in header_sizes([paths[int(i)] for i in idx]):
        if wh is not None:
            counts[wh] = counts.get(wh, 0) + 1
    return counts


def _strict_error(skipped: list[tuple[str, str]]) -> DataError:
    listed = "; ".join(f"{p}: {why}" for p, why in skipped[:5])
    more = f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    return DataError(f"{len(skipped)} file(s) cannot be used (--strict-data): {listed}{more}")


def _decode_split(
    root: Path,
    class_names: list[str] | None,
    opt: _Decode,
    *,
    seen: dict[tuple[int, int], str] | None = None,
    evaluation: bool = False,
) -> tuple[ImageArray, list[str], list[tuple[str, str]], Path | None, FolderStorage | None]:
    """One split folder scanned and decoded: ``(images and labels, class names, (path, reason) of every file
    left out, the decode cache file, the storage it was stored by)``. ``seen``: the files of the splits already
    loaded, by ``(st_dev, st_ino)``; one of them reached again here is left out of this split, so no file is in
    both train and val. With a storage, ``evaluation`` stores the split ready for evaluation (its ``eval_side``);
    a storage still to be made (a function of the header sizes) is made from this split's headers."""
    problems: list[tuple[str, str]] = []
    paths, labels, names = scan_classes(root, class_names, min_classes=opt.min_classes, seen=seen, problems=problems)
    if problems and opt.strict:
        raise _strict_error(problems)
    storage = opt.storage
    if callable(storage):
        counts = _header_counts(paths)
        storage = storage(counts, n_files=len(paths)) if counts else None  # no readable header: decoded as they are
    common = {
        "mode": opt.mode,
        "cache_dir": opt.cache_dir,
        "name": f"{root.resolve().parent.name}-{root.resolve().name}",  # however the folder was named: one cache
        "workers": opt.workers,
        "progress": opt.progress,
        "max_pixels": opt.max_pixels,
        "buffer_bytes": opt.buffer_bytes,
    }
    if storage is None and opt.crop is not None:  # stored for evaluating a square model: squares, resized as it resizes
        dec = decode_files(paths, size=opt.size, crop=opt.crop, **common)
    elif storage is None:
        # never store more pixels than training at this size reads
        dec = decode_files(paths, fallback_size=opt.size, max_side=opt.size, **common)
    elif evaluation and storage.eval_side is not None:
        crop = storage.size[0] if storage.size is not None else None  # the evaluation's centre crop of the squares
        dec = decode_files(paths, size=storage.eval_side, crop=crop, **common)
    else:
        dec = decode_files(paths, keep_aspect=True, max_side=storage.store_side, **common)
    # PIL's reasons quote the path with repr(), which shows a non-UTF-8 byte as '\udcff': quote it readably
    skipped = problems + [(readable(p), readable(why.replace(repr(p), f"'{readable(p)}'"))) for p, why in dec.skipped]
    if dec.skipped and opt.strict:
        raise _strict_error(skipped)
    if not dec.kept:
        first = f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        hint = "; pass a smaller --img-size or a larger --memory-budget" if "--memory-budget" in first else ""
        raise DataError(f"{root}: none of the {len(paths)} image files could be decoded{first}{hint}")
    kept = np.asarray(dec.kept, dtype=np.int64)
    rows = ImageArray(dec.images, labels[kept], [paths[i] for i in kept.tolist()])
    return rows, names, skipped, dec.path, storage


def _folder(root: Path, *, val_split: float | None, opt: _Decode, eval_only: bool = False) -> DataSplits:
    train_dir = root / "train"
    val_dir = eval_split_dir(root)
    if val_dir is not None and val_split is None:
        seen: dict[tuple[int, int], str] = {}
        if eval_only:  # train/ is only scanned: its class names and its files (none of which val may reuse)
            _, _, names = scan_classes(train_dir, None, min_classes=opt.min_classes, seen=seen, problems=[])
            val, _, skipped, f2, storage = _decode_split(val_dir, names, opt, seen=seen, evaluation=True)
            empty = val.subset(np.arange(0))
            files = [f2] if f2 else []
            return DataSplits(
                root.name, empty, val, names, val_name=val_dir.name, skipped=skipped, cache_files=files, storage=storage
            )
        train, names, skipped, f1, storage = _decode_split(train_dir, None, opt, seen=seen)
        opt = dataclasses.replace(opt, storage=storage)  # the training split's storage stores the evaluation split too
        val, _, skipped2, f2, _ = _decode_split(val_dir, names, opt, seen=seen, evaluation=True)
        files = [f for f in (f1, f2) if f]
        others = tuple(d for d in EVAL_DIRS if d != val_dir.name and (root / d).is_dir())
        return DataSplits(
            root.name,
            train,
            val,
            names,
            val_name=val_dir.name,
            skipped=skipped + skipped2,
            cache_files=files,
            storage=storage,
            left_alone=others,
        )
    tree = train_dir if train_dir.is_dir() else root
    full, names, skipped, f1, storage = _decode_split(tree, None, opt)  # one cache: val is not stored apart
    if eval_only and val_split is None:  # nothing trains on it: the whole folder is evaluated, none held out
        whole = dataclasses.replace(storage, eval_side=None) if storage is not None else None
        files = [f1] if f1 else []
        return DataSplits(
            root.name, full.subset(np.arange(0)), full, names, val_name="all", skipped=skipped, cache_files=files,
            storage=whole,
        )  # fmt: skip
    tr, va = stratified_split(full.labels, val_split or DEFAULT_HOLD_OUT, seed=0)
    # views over the decode cache, not copies: the tree may be larger than RAM
    files = [f1] if f1 else []
    return DataSplits(
        root.name,
        full.subset(tr),
        full.subset(va),
        names,
        val_name="val",
        skipped=skipped,
        cache_files=files,
        storage=dataclasses.replace(storage, eval_side=None) if storage is not None else None,
        held_out=val_split or DEFAULT_HOLD_OUT,
        by_class=stratifies(full.labels, val_split or DEFAULT_HOLD_OUT),
    )


def load_data(
    spec: str,
    *,
    val_split: float | None = None,
    size: int | None = None,
    grayscale: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    strict: bool = False,
    workers: int = 2,
    progress: bool = True,
    max_image_pixels: int | None = None,
    buffer_bytes: int | None = None,
    min_classes: int = 1,
    eval_only: bool = False,
    storage: FolderStorage | Callable[..., FolderStorage] | None = None,
    crop: int | None = None,
) -> DataSplits:
    """Load ``spec``: ``digits`` (embedded), ``cifar10`` / ``cifar100`` (torchvision, online),
    or a folder: ``root/train/<class>/*`` with ``root/val`` (or ``test``), or one class-folder
    tree split with ``val_split`` (deterministic, stratified; default 0.1).

    Folder images are decoded once into a cache (``cache_dir``, default ``~/.cache/vitlab``)
    at their own size when all files share it; otherwise they are resized (shorter side +
    center crop) to ``size`` (default: the median shorter side, strips left out, so outliers never
    set it). Undecodable files are skipped and listed in ``DataSplits.skipped`` with their reason
    (readable, whatever bytes the name holds), or raise :class:`DataError` with ``strict`` (listing
    them); so are images over ``max_image_pixels`` (decompression-bomb guard, default PIL's 89.5 M),
    strips more than :data:`~vitlab.data.images.decode.MAX_ASPECT` times longer than wide, images that would
    take more than half of ``buffer_bytes`` once resized, files that are not regular files (FIFOs,
    devices: never opened), a second path to a file already taken, and link loops (each real folder is
    entered once). A class folder without images, fewer than ``min_classes`` class folders, or an
    evaluation class folder absent from ``train/``, is a :class:`DataError`.

    ``eval_only``: a folder with ``train/`` and ``val/`` (or ``test/``) decodes its evaluation split
    alone (``train/`` is scanned for its class names, and the returned ``train`` is empty); a folder without them
    and without ``val_split`` is evaluated whole (``val`` is every image, named ``all``; nothing is held out, as
    nothing trains on it).

    ``crop`` (with ``size``, without ``storage``): a folder stored for evaluating a square model that centre-crops
    ``crop`` after resizing the shorter side to ``size`` (:func:`vitlab.evaluate.decode_size`): every image of
    every split is stored as a ``size`` square, resized as the evaluation resizes (whatever sizes the files
    share) and placed so that its centre ``crop`` is that of the whole resized image
    (:func:`~vitlab.data.images.decode.decode_image`), so the evaluation only crops and its pixels are those of timm's
    transform of the files.

    ``storage`` (a training run's; ``size`` is then unused): a :class:`FolderStorage`, or a function that makes one
    from ``(width, height) -> count`` of the training split's headers (up to :data:`HEADER_SAMPLE` files,
    read before anything is decoded) and ``n_files=`` the split's number of files. The training images keep their
    aspect ratio (their shorter side at most the storage's ``store_side``: images of several sizes,
    :class:`PackedImages`); the evaluation split of a ``train/`` + ``val/`` folder is stored ready for evaluation
    (the storage's ``eval_side``). The storage is returned as ``DataSplits.storage``, and its ``size`` is
    ``DataSplits.image_size``.

    Memory: ``buffer_bytes`` (default 64 MiB, ``--memory-budget``) bounds the decoded images
    held in memory while the cache is built; the splits are then read from the memory-mapped
    cache (a ``val_split`` split as :class:`ImageRows` views, not copies), so a folder larger
    than RAM loads within it.
    """
    from .cache.store import default_cache_dir

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = builtin_data(spec)
    if key == "digits":
        return _digits(val_split)
    if key is not None:
        return _cifar(key, cache)
    if is_shard_spec(spec):  # (vitlab train and eval stream them, vitlab.data.shards: read by neither here)
        raise DataError(f"--data {spec}: tar shards, which this command does not read; give the image folder they "
                        "were packed from (vitlab train and vitlab eval read shards)")  # fmt: skip
    root = data_folder(spec)
    if root is not None:
        opt = _Decode(
            size=size,
            mode="L" if grayscale else "RGB",
            cache_dir=cache,
            strict=strict,
            workers=workers,
            progress=progress,
            max_pixels=max_image_pixels,
            buffer_bytes=buffer_bytes or DEFAULT_BUFFER_BYTES,
            min_classes=min_classes,
            storage=storage,
            crop=crop,
        )
        return _folder(root, val_split=val_split, opt=opt, eval_only=eval_only)
    if spec.strip().lower().startswith("hf:"):
        raise DataError(
            f"--data {spec}: the Hugging Face datasets reader is not built; write the data set as an ImageFolder and "
            "`vitlab data pack` it (docs/scale.md)"
        )
    what = "not 'digits', 'cifar10', 'cifar100', an existing folder or tar shards"
    if Path(spec).expanduser().is_file():
        what = f"a file; --data is {what.removeprefix('not ')}{labels_file_hint(spec)}"
    raise DataError(f"--data {spec!r}: {what}")
