"""Decode image files once into a memory-mapped uint8 array.

The cache key hashes every file's path, size and modification time (plus the
target size), so editing, adding or removing a file makes a new cache, and a
second run or a later epoch never decodes a JPEG again. Files that cannot be
decoded are reported and skipped instead of failing mid-epoch.

Memory: decoded images go straight into the memory-mapped file, at most half of
``buffer_bytes`` of them in flight (the other half is headroom for the decoding itself),
so a dataset larger than RAM is cached and then read page by page; nothing holds the
whole array in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._fs import remove_stale
from .decode import DEFAULT_MAX_IMAGE_PIXELS, MAX_ASPECT, decode_image, image_size, too_thin, typical_side

__all__ = ["DEFAULT_BUFFER_BYTES", "DecodedFiles", "decode_files", "default_cache_dir"]

_VERSION = 3  # 2: EXIF orientation applied, grey (mode L) from the composited RGB image; 3: strips skipped
DEFAULT_BUFFER_BYTES = 64 << 20
"""The memory budget of building a decode cache (``--memory-budget``'s default), half of it for decoded images."""


def default_cache_dir() -> Path:
    """``$VITLAB_CACHE`` or ``~/.cache/vitlab``."""
    return Path(os.environ.get("VITLAB_CACHE", Path.home() / ".cache" / "vitlab"))


@dataclass
class DecodedFiles:
    """``images[i]`` is the decoded ``kept[i]``; ``skipped`` lists ``(path, reason)``."""

    images: np.ndarray
    kept: list[int]
    skipped: list[tuple[str, str]]


def _key(paths: Sequence[str], size: int | None, mode: str) -> str:
    h = hashlib.sha256(f"v{_VERSION}|{size}|{mode}|".encode())
    for p in paths:
        try:
            st = os.stat(p)
            h.update(os.fsencode(os.path.abspath(p)) + f"|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(os.fsencode(os.path.abspath(p)) + b"|missing\n")
    return h.hexdigest()[:20]


def decode_files(
    paths: Sequence[str],
    *,
    size: int | None = None,
    fallback_size: int | None = None,
    mode: str = "RGB",
    cache_dir: str | os.PathLike[str] | None = None,
    name: str = "images",
    workers: int = 2,
    progress: bool = True,
    max_pixels: int | None = None,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
) -> DecodedFiles:
    """Decode ``paths`` into one ``(N, S, S, C)`` uint8 memmap under ``cache_dir``.

    ``size=None`` keeps the native size when every file shares it; when they differ
    (or ``size`` is given) each image is resized (shorter side) and center-cropped to
    ``size`` x ``size`` (``fallback_size``, else :func:`~vitlab.data.decode.typical_side`, for mixed sizes).
    ``mode`` is a PIL mode, ``RGB`` or ``L``: palette, grayscale and RGBA files are converted to it.
    ``max_pixels`` is the decompression-bomb guard of :func:`~vitlab.data.decode.decode_image`.
    ``buffer_bytes`` is the memory budget of building a cache (``--memory-budget``): at most half
    of it holds decoded images waiting to be written to the memmap (at least one image); the other
    half is headroom for the decoders' own temporaries.
    Per-file bookkeeping (paths, labels, the list of kept files) is not part of the budget.
    """
    from tqdm.auto import tqdm

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = _key(
        paths,
        size if size is not None else f"native-or-{fallback_size}",
        mode + (f"|{max_pixels}" if max_pixels and max_pixels != DEFAULT_MAX_IMAGE_PIXELS else ""),
    )
    data_f, meta_f = cache / f"{name}-{key}.u8", cache / f"{name}-{key}.json"
    if meta_f.is_file() and data_f.is_file():
        meta = json.loads(meta_f.read_text())
        images = np.memmap(data_f, dtype=np.uint8, mode="r", shape=tuple(meta["shape"]))
        return DecodedFiles(images, meta["kept"], [tuple(s) for s in meta["skipped"]])  # type: ignore[misc]

    chans = 3 if mode == "RGB" else 1
    skipped: list[tuple[str, str]] = []
    if size is None:
        sizes = {}
        for p in paths:
            wh = image_size(p)
            if wh is not None:
                sizes[wh] = sizes.get(wh, 0) + 1
        if not sizes:
            raise ValueError(f"none of the {len(paths)} image files under {name} can be read")
        typical = {wh: n for wh, n in sizes.items() if not too_thin(*wh)} or sizes  # strips never set the size
        common = max(typical, key=typical.__getitem__)
        if len(typical) > 1:
            size = fallback_size or typical_side(typical)  # mixed sizes: square crops
        height, width = common[1], common[0]
    if size is not None:
        height = width = size
    remove_stale(cache, f"{name}-{key}.tmp")
    tmp = data_f.with_suffix(f".tmp{os.getpid()}")
    out = np.memmap(tmp, dtype=np.uint8, mode="w+", shape=(max(len(paths), 1), height, width, chans))
    kept: list[int] = []

    def work(i: int) -> tuple[int, np.ndarray | None, str]:
        try:
            arr = decode_image(
                paths[i],
                mode=mode,
                size=size,
                max_pixels=max_pixels,
                max_aspect=MAX_ASPECT,
                max_bytes=buffer_bytes // 2,
            )
            if arr.shape != (height, width, chans):
                return i, None, f"size {arr.shape[1]}x{arr.shape[0]} differs from {width}x{height}"
            return i, arr, ""
        except Exception as e:  # any unreadable file is reported, never fatal here
            return i, None, f"{type(e).__name__}: {e}"

    # Executor.map would queue every file at once and could hold all decoded images; a bounded window cannot.
    # Half the budget: results can fill the whole window while this thread is descheduled; the rest is headroom.
    window = max(1, min(len(paths), buffer_bytes // 2 // max(1, height * width * chans)))
    with (
        ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
        tqdm(total=len(paths), desc=f"decoding {name} (once)", unit="img", disable=not progress, leave=False) as bar,
    ):
        for start in range(0, len(paths), window):
            for i, arr, err in pool.map(work, range(start, min(start + window, len(paths)))):
                if arr is None:
                    skipped.append((paths[i], err))
                else:
                    out[len(kept)] = arr
                    kept.append(i)
                bar.update(1)
    out.flush()
    shape = (len(kept), height, width, chans)
    del out
    with open(tmp, "r+b") as f:
        f.truncate(int(np.prod(shape)))
        os.fsync(f.fileno())
    os.replace(tmp, data_f)
    tmp_meta = meta_f.with_suffix(f".tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps({"shape": list(shape), "kept": kept, "skipped": skipped, "count": len(paths)}))
    os.replace(tmp_meta, meta_f)  # the metadata appears last: its presence marks a complete cache
    images = np.memmap(data_f, dtype=np.uint8, mode="r", shape=shape) if len(kept) else np.zeros(shape, np.uint8)
    return DecodedFiles(images, kept, skipped)
