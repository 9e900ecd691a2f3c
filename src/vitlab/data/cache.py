"""Decode image files once into a memory-mapped uint8 array.

The cache key hashes every file's path, size and modification time (plus the
target size), so editing, adding or removing a file makes a new cache, and a
second run or a later epoch never decodes a JPEG again. Files that cannot be
decoded are reported and skipped instead of failing mid-epoch.

Memory: decoded images go straight into the cache file, at most half of
``buffer_bytes`` of them in flight (the other half is headroom for the decoding itself),
so a dataset larger than RAM is cached and then read page by page through a memory map;
nothing holds the whole array in memory.

Faults: a cache is built in a temp file of its own (``<name>-<key>.tmp<pid>-<random>``,
so two writers never share one) whose space is reserved first (``posix_fallocate``), and
is renamed into place only when complete, the metadata last. A full disk is therefore one
:class:`CacheError` before any decoding (or, on a file system that cannot reserve space, at
the first write that fails), naming the folder, the space needed and the space free, and no
temp file is left. The images are written with ``write()``, never through a
memory map: a write into a mapping that the disk cannot back kills the process with
SIGBUS, where ``write()`` returns ``ENOSPC``. Temp files of killed writers are removed.

Every chunk of :data:`CHUNK_BYTES` of images has a CRC-32 in the metadata. Opening a cache
checks the metadata (version, key, shape, dtype, counts, file size) and then every chunk's
checksum, in one sequential read of the file; anything that does not match is reported in
one line naming the file, deleted and decoded again, so a damaged cache is never trained on.
The check costs one read of the file, no more than one epoch's reads (the first epoch then
finds the file in the page cache when it fits in RAM). It is done up front rather than lazily
in the read path because a lazy check would fail in the middle of an epoch, inside data
loader workers that would each check again, where the cache can no longer be rebuilt.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._fs import remove_stale, writer_suffix
from .._units import format_size as _bytes
from ..errors import VitlabError
from .cache_check import content_problem, metadata_problem
from .decode import (
    DEFAULT_MAX_IMAGE_PIXELS,
    MAX_ASPECT,
    decode_image,
    image_size,
    resized_shape,
    too_thin,
    typical_side,
)

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_BUFFER_BYTES",
    "CacheError",
    "DecodedFiles",
    "cache_key",
    "decode_files",
    "default_cache_dir",
]

_VERSION = 4  # 4: strips skipped; 3: reserved space, validated metadata, a CRC-32 per chunk; 2: EXIF, grey from RGB
DEFAULT_BUFFER_BYTES = 64 << 20
"""The memory budget of building a decode cache (``--memory-budget``'s default), half of it for decoded images."""
CHUNK_BYTES = 8 << 20
"""About this many bytes of whole images share one checksum (at least one image per chunk)."""


class CacheError(VitlabError, OSError):
    """The decode cache cannot be written (no space, no permission); the message names the folder."""


def default_cache_dir() -> Path:
    """``$VITLAB_CACHE`` or ``~/.cache/vitlab``."""
    return Path(os.environ.get("VITLAB_CACHE", Path.home() / ".cache" / "vitlab"))


@dataclass
class DecodedFiles:
    """``images[i]`` is the decoded ``kept[i]``; ``skipped`` lists ``(path, reason)``; ``path``: the cache file."""

    images: np.ndarray
    kept: list[int]
    skipped: list[tuple[str, str]]
    path: Path | None = None


def _key(paths: Sequence[str], size: int | str | None, mode: str) -> str:
    h = hashlib.sha256(f"v{_VERSION}|{size}|{mode}|".encode())
    for p in paths:
        try:
            st = os.stat(p)
            h.update(os.fsencode(os.path.abspath(p)) + f"|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(os.fsencode(os.path.abspath(p)) + b"|missing\n")
    return h.hexdigest()[:20]


cache_key = _key
"""The cache key of ``paths`` (their absolute paths, sizes and modification times), ``size`` and ``mode``:
also what a training run's data fingerprint hashes (:func:`vitlab.train.loaders.data_fingerprint`)."""


def _source(paths: Sequence[str]) -> str:
    """The folder the cached files come from (their common parent), for ``vitlab cache ls``."""
    try:
        return os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths]) if paths else ""
    except ValueError:  # paths on different drives
        return ""


def _open(data_f: Path, meta_f: Path, *, key: str, count: int, chans: int, buffer_bytes: int) -> DecodedFiles | None:
    """The cache ``data_f`` + ``meta_f`` when complete and intact; ``None`` when there is none. A cache
    that does not validate is reported on one line naming the file, deleted, and ``None`` returned."""
    if not meta_f.is_file():
        return None  # no cache, or a writer between its two renames: build (a rename replaces a stray data file)
    bad, problem = meta_f, None
    try:
        meta = json.loads(meta_f.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        problem = f"the metadata does not parse ({e})"
    except OSError as e:
        problem = f"the metadata cannot be read ({e.strerror or e})"
    if problem is None:
        problem = metadata_problem(meta, version=_VERSION, key=key, count=count, chans=chans)
    if problem is None:
        bad, expected = data_f, int(np.prod(meta["shape"]))
        try:
            held = data_f.stat().st_size
            if held != expected:
                problem = f"it holds {held:,} bytes, not the {expected:,} of {meta['shape'][0]} images"
        except OSError as e:
            problem = f"it cannot be read ({e.strerror or e})"
    if problem is None:
        shape = tuple(meta["shape"])
        image_bytes = int(np.prod(shape[1:]))
        problem = content_problem(
            data_f,
            image_bytes=image_bytes,
            chunk_images=meta["chunk_images"],
            crcs=meta["crc32"],
            buffer_bytes=buffer_bytes,
        )
    if problem is None:
        images = np.memmap(data_f, dtype=np.uint8, mode="r", shape=shape) if shape[0] else np.zeros(shape, np.uint8)
        return DecodedFiles(images, meta["kept"], [tuple(s) for s in meta["skipped"]], data_f)  # type: ignore[misc]
    print(f"warning: {bad}: not a valid decode cache: {problem}; deleting it and decoding again", file=sys.stderr)
    meta_f.unlink(missing_ok=True)
    data_f.unlink(missing_ok=True)
    return None


def _no_space(cache: Path, name: str, need: int, free: int | None) -> CacheError:
    free_s = _bytes(free) if free is not None else "less"
    return CacheError(
        f"{cache}: not enough disk space for the decode cache of {name}: it needs {_bytes(need)}, {free_s} free; "
        "free some space or pass --cache-dir DIR on a disk with room"
    )


def _free_bytes(cache: Path) -> int | None:
    try:
        return shutil.disk_usage(cache).free
    except OSError:
        return None


def _reserve(fd: int, nbytes: int) -> None:
    """Allocate ``nbytes`` for ``fd`` now, so a full disk fails here with ``ENOSPC``; file systems without
    the call (or an OS without ``posix_fallocate``) are left to ``write()``, which reports ``ENOSPC`` too."""
    if nbytes <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


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
    max_side: int | None = None,
) -> DecodedFiles:
    """Decode ``paths`` into one ``(N, S, S, C)`` uint8 memmap under ``cache_dir``.

    ``size=None`` keeps the native size when every file shares it; when they differ
    (or ``size`` is given) each image is resized (shorter side) and center-cropped to
    ``size`` x ``size`` (``fallback_size``, else :func:`~vitlab.data.decode.typical_side`, for mixed sizes).
    ``mode`` is a PIL mode, ``RGB`` or ``L``: palette, grayscale and RGBA files are converted to it.
    ``max_pixels`` is the decompression-bomb guard of :func:`~vitlab.data.decode.decode_image`.
    ``buffer_bytes`` is the memory budget of building a cache (``--memory-budget``): at most half
    of it holds decoded images waiting to be written to the cache file (at least one image); the other
    half is headroom for the decoders' own temporaries.
    ``max_side`` (without ``size``): the training resolution's cache size; native images whose shorter
    side is longer are stored with that shorter side, aspect ratio kept (no crop), and mixed sizes
    are cropped to at most that side, so the cache grows with the number of images, not their pixels.
    Per-file bookkeeping (paths, labels, the list of kept files) is not part of the budget.
    An existing cache is checked first (see the module's notes) and rebuilt when damaged; a cache
    that cannot be written (no space) is a :class:`CacheError`.
    """
    from .._progress import ProgressLog

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = _key(
        paths,
        size if size is not None else f"native-or-{fallback_size}",
        mode
        + (f"|{max_pixels}" if max_pixels and max_pixels != DEFAULT_MAX_IMAGE_PIXELS else "")
        + (f"|max{max_side}" if max_side is not None and size is None else ""),
    )
    chans = 3 if mode == "RGB" else 1
    stem = f"{name}-{key}"
    data_f, meta_f = cache / f"{stem}.u8", cache / f"{stem}.json"
    found = _open(data_f, meta_f, key=key, count=len(paths), chans=chans, buffer_bytes=buffer_bytes)
    if found is not None:
        return found

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
            if max_side is not None:
                size = min(size, max_side)
        height, width = common[1], common[0]
        if size is None and max_side is not None and min(height, width) > max_side:
            width, height = resized_shape(width, height, max_side)  # as decode_image(shorter_side=) shrinks
        else:
            max_side = None  # stored at the native size: nothing to shrink
    if size is not None:
        height = width = size
    image_bytes = height * width * chans
    need = len(paths) * image_bytes
    remove_stale(cache, f"{stem}.tmp")  # temp files of killed writers
    free = _free_bytes(cache)
    if free is not None and free < need:
        raise _no_space(cache, name, need, free)
    suffix = writer_suffix()
    tmp, tmp_meta = cache / f"{stem}.tmp{suffix}", cache / f"{stem}.tmp{suffix}.json"
    kept: list[int] = []
    crcs: list[int] = []
    chunk_images = max(1, CHUNK_BYTES // max(1, image_bytes))

    def work(i: int) -> tuple[int, np.ndarray | None, str]:
        try:
            arr = decode_image(
                paths[i],
                mode=mode,
                size=size,
                max_pixels=max_pixels,
                max_aspect=MAX_ASPECT,
                max_bytes=buffer_bytes // 2,
                shorter_side=max_side if size is None else None,
            )
            if arr.shape != (height, width, chans):
                return i, None, f"size {arr.shape[1]}x{arr.shape[0]} differs from {width}x{height}"
            return i, np.ascontiguousarray(arr, dtype=np.uint8), ""
        except Exception as e:  # any unreadable file is reported, never fatal here
            return i, None, f"{type(e).__name__}: {e}"

    # Executor.map would queue every file at once and could hold all decoded images; a bounded window cannot.
    # Half the budget: results can fill the whole window while this thread is descheduled; the rest is headroom.
    window = max(1, min(len(paths), buffer_bytes // 2 // max(1, image_bytes)))
    try:
        with open(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), "r+b") as f:
            _reserve(f.fileno(), need)
            crc = 0
            with (
                ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
                ProgressLog(
                    total=len(paths), desc=f"decoding {name} (once)", unit="img", enabled=progress, leave=False
                ) as bar,
            ):
                for start in range(0, len(paths), window):
                    for i, arr, err in pool.map(work, range(start, min(start + window, len(paths)))):
                        if arr is None:
                            skipped.append((paths[i], err))
                        else:
                            f.write(memoryview(arr).cast("B"))
                            crc = zlib.crc32(memoryview(arr).cast("B"), crc)
                            kept.append(i)
                            if len(kept) % chunk_images == 0:
                                crcs.append(crc)
                                crc = 0
                        bar.update(1)
            if len(kept) % chunk_images:
                crcs.append(crc)
            f.truncate(len(kept) * image_bytes)  # the reservation covered the skipped files too
            f.flush()
            os.fsync(f.fileno())
        shape = (len(kept), height, width, chans)
        meta = {
            "source": _source(paths),
            "version": _VERSION,
            "key": key,
            "dtype": "uint8",
            "shape": list(shape),
            "count": len(paths),
            "kept": kept,
            "skipped": skipped,
            "chunk_images": chunk_images,
            "crc32": crcs,
        }
        tmp_meta.write_text(json.dumps(meta))
        os.replace(tmp, data_f)
        os.replace(tmp_meta, meta_f)  # the metadata appears last: its presence marks a complete cache
    except OSError as e:
        tmp.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise _no_space(cache, name, need, _free_bytes(cache)) from e
        raise CacheError(
            f"{cache}: cannot write the decode cache of {name} ({e.strerror or e}); pass --cache-dir DIR to put it "
            "elsewhere"
        ) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        tmp_meta.unlink(missing_ok=True)
        raise
    images = np.memmap(data_f, dtype=np.uint8, mode="r", shape=shape) if len(kept) else np.zeros(shape, np.uint8)
    return DecodedFiles(images, kept, skipped, data_f)
