"""Decode image files once into a memory-mapped uint8 array.

The cache key hashes every file's path, size and modification time plus every option of the
decode (the size or shorter side stored, the layout, the colour mode, the decompression-bomb
limit), so editing, adding or removing a file or changing an option makes a new cache, and a
second run or a later epoch never decodes a JPEG again. The memory budget changes what is decoded
only when an image is over its limit: the metadata records the budget and whether any image was
skipped for it, and a cache is used again only when the budget given now would skip the same
images. Files that cannot be decoded are reported and skipped instead of failing mid-epoch.

Layout: images of one size are one ``(N, H, W, C)`` memmap. Images stored at their own aspect
ratio (``keep_aspect``: a folder of photos, each with its shorter side at most the training
resolution needs) differ in size, and are held back to back in one flat file read as
:class:`~vitlab.data.images.rows.PackedImages`; the sizes are known from the files' headers before
anything is decoded, so the space is reserved and the memory bounded as for one size.

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

Every chunk of about :data:`CHUNK_BYTES` of whole images has a CRC-32 in the metadata. Opening a cache
checks the metadata (version, key, shape, dtype, counts, file size) and then every chunk's
checksum, in one sequential read of the file; anything that does not match is reported in
one line naming the file, deleted and decoded again, so a damaged cache is never trained on.
The check costs one read of the file, no more than one epoch's reads (the first epoch then
finds the file in the page cache when it fits in RAM). It is done up front rather than lazily
in the read path because a lazy check would fail in the middle of an epoch, inside data
loader workers that would each check again, where the cache can no longer be rebuilt.
"""

from __future__ import annotations

import contextlib
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
from typing import IO

import numpy as np

from ..._fs import remove_stale, writer_suffix
from ..._units import format_size as _bytes
from ...errors import VitlabError
from ..images.decode import DEFAULT_MAX_IMAGE_PIXELS, MAX_ASPECT, OverBudget, decode_image
from ..images.rows import PackedImages
from .check import byte_offsets, content_problem, metadata_problem
from .layout import cache_layout, windows
from .limit import cache_entry, hold, make_room, touch

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_BUFFER_BYTES",
    "CacheError",
    "DecodedFiles",
    "cache_key",
    "decode_files",
    "default_cache_dir",
]

_VERSION = 6  # 6: evaluation's resize rule (torchvision's sizes and centre, JPEGs at full scale); 5: aspect kept
# (images of several sizes), budget in the metadata; 4: strips skipped; 3: CRCs
_FINGERPRINT_VERSION = 4  # cache_key's: a run's data fingerprint must not change with the cache's format
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
    """``images[i]`` is the decoded ``kept[i]``; ``skipped`` lists ``(path, reason)``; ``path``: the cache file.
    ``images`` is an ``(N, H, W, C)`` array when the images share one size, else :class:`PackedImages`."""

    images: np.ndarray | PackedImages
    kept: list[int]
    skipped: list[tuple[str, str]]
    path: Path | None = None


def _stat_lines(paths: Sequence[str]) -> bytes:
    """Every file's absolute path, size and modification time (``missing`` for a file gone): what a key hashes."""
    lines = []
    for p in paths:
        try:
            st = os.stat(p)
            lines.append(os.fsencode(os.path.abspath(p)) + f"|{st.st_size}|{st.st_mtime_ns}\n".encode())
        except OSError:
            lines.append(os.fsencode(os.path.abspath(p)) + b"|missing\n")
    return b"".join(lines)


def _key(
    paths: Sequence[str], size: int | str | None, mode: str, *, version: int = _VERSION, lines: bytes | None = None
) -> str:
    h = hashlib.sha256(f"v{version}|{size}|{mode}|".encode())
    h.update(_stat_lines(paths) if lines is None else lines)
    return h.hexdigest()[:20]


def cache_key(paths: Sequence[str], size: int | str | None, mode: str) -> str:
    """The key of ``paths`` (their absolute paths, sizes and modification times), ``size`` and ``mode``: what a
    training run's data fingerprint hashes (:func:`vitlab.train.engine.run_data.data_fingerprint`). Unlike the cache's
    own key it does not change with the cache's format, so a run started before a new format still resumes."""
    return _key(paths, size, mode, version=_FINGERPRINT_VERSION)


def _source(paths: Sequence[str]) -> str:
    """The folder the cached files come from (their common parent), for ``vitlab cache ls``."""
    try:
        return os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in paths]) if paths else ""
    except ValueError:  # paths on different drives
        return ""


def _mapped(f: IO[bytes], meta: dict) -> np.ndarray | PackedImages:
    """The images of a complete cache file ``f`` (open, its shared lock taken: :func:`.limit.hold`),
    read-only through a memory map (none for zero images); the map keeps its own copy of the descriptor, and with
    it the lock, for as long as it lives, so an evictor never deletes a cache that is read."""
    n, h, w, c = meta["shape"]
    if "heights" not in meta:
        shape = (n, h, w, c)
        return np.memmap(f, dtype=np.uint8, mode="r", shape=shape) if n else np.zeros(shape, np.uint8)
    total = int(byte_offsets(meta)[-1])
    flat = np.memmap(f, dtype=np.uint8, mode="r", shape=(total,)) if total else np.zeros(0, np.uint8)
    return PackedImages(flat, heights=meta["heights"], widths=meta["widths"], chans=c)


def _open(
    data_f: Path, meta_f: Path, *, key: str, count: int, chans: int, buffer_bytes: int, max_bytes: int
) -> DecodedFiles | None:
    """The cache ``data_f`` + ``meta_f`` when complete and intact; ``None`` when there is none, or when it was
    built under a memory budget that skipped other images than ``max_bytes`` would (it is then built again).
    A cache that does not validate is reported on one line naming the file, deleted, and ``None`` returned."""
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
    if problem is None and not _budget_fits(meta, max_bytes):
        return None  # another budget would skip other images: decode again (the new cache replaces this one)
    f = None
    if problem is None:
        bad, offsets = data_f, byte_offsets(meta)
        try:
            f = open(data_f, "rb")  # noqa: SIM115  (kept open into the memory map, which holds the lock)
            if not hold(f):  # an evictor is deleting it: decode again
                f.close()
                return None
            held = os.fstat(f.fileno()).st_size
            if held != offsets[-1]:
                problem = f"it holds {held:,} bytes, not the {int(offsets[-1]):,} of {meta['shape'][0]} images"
        except OSError as e:
            problem = f"it cannot be read ({e.strerror or e})"
    if problem is None:
        problem = content_problem(
            data_f, offsets=offsets, chunk_ends=meta["chunk_ends"], crcs=meta["crc32"], buffer_bytes=buffer_bytes
        )
    if problem is None:
        try:
            images = _mapped(f, meta)  # type: ignore[arg-type]
        finally:
            f.close()  # type: ignore[union-attr]
        touch(data_f)
        return DecodedFiles(images, meta["kept"], [tuple(s) for s in meta["skipped"]], data_f)  # type: ignore[misc]
    if f is not None:
        f.close()
    print(f"warning: {bad}: not a valid decode cache: {problem}; deleting it and decoding again", file=sys.stderr)
    meta_f.unlink(missing_ok=True)
    data_f.unlink(missing_ok=True)
    return None


def _budget_fits(meta: dict, max_bytes: int) -> bool:
    """Whether a cache built under ``meta``'s memory budget skipped what ``max_bytes`` would: the same budget, or
    none skipped for it and a larger one now."""
    built = meta["max_bytes"]
    return built == max_bytes or (not meta["over_budget"] and max_bytes >= built)


def _native_twin(
    cache: Path, name: str, *, files: str, mode_key: str, count: int, chans: int, buffer_bytes: int, max_bytes: int
) -> DecodedFiles | None:
    """A cache of the same files, mode and budget that stored every image at its own size, as this request would
    too (a larger ``max_side``, or another layout of the same native images): its pixels are this request's, byte
    for byte, so it serves it instead of a second copy. None when there is none."""
    for meta_f in sorted(cache.glob(f"{name}-*.json")):
        entry = cache_entry(meta_f)
        if entry is None:
            continue
        try:
            meta = json.loads(meta_f.read_bytes())
        except (OSError, ValueError):
            continue
        twin = meta.get("files") == files and meta.get("mode_key") == mode_key and meta.get("native") is True
        if twin and meta.get("version") == _VERSION and isinstance(meta.get("max_bytes"), int):
            found = _open(
                entry.path, meta_f, key=str(meta["key"]), count=count, chans=chans, buffer_bytes=buffer_bytes,
                max_bytes=max_bytes,
            )  # fmt: skip
            if found is not None:
                return found
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
    crop: int | None = None,
    fallback_size: int | None = None,
    mode: str = "RGB",
    cache_dir: str | os.PathLike[str] | None = None,
    name: str = "images",
    workers: int = 2,
    progress: bool = True,
    max_pixels: int | None = None,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    max_side: int | None = None,
    keep_aspect: bool = False,
) -> DecodedFiles:
    """Decode ``paths`` into one uint8 cache file under ``cache_dir``, read through a memory map.

    ``size=None`` keeps the native size when every file shares it; when they differ
    (or ``size`` is given) each image is resized (shorter side) and center-cropped to
    ``size`` x ``size`` (``fallback_size``, else :func:`~vitlab.data.images.decode.typical_side`, for mixed sizes).
    ``crop`` (with ``size``): the centre crop an evaluation will take of the stored squares; each square is
    placed for it (:func:`~vitlab.data.images.resize.centre_square`), so the evaluation sees the centre crop of the
    whole resized image, as timm's transform does.
    ``keep_aspect`` (without ``size``): every image keeps its own aspect ratio and its whole extent, its
    shorter side shrunk to ``max_side`` when longer (never enlarged), whatever sizes the files share; the
    images then differ in size (:class:`~vitlab.data.images.rows.PackedImages`) unless they all come out alike.
    ``mode`` is a PIL mode, ``RGB`` or ``L``: palette, grayscale and RGBA files are converted to it.
    ``max_pixels`` is the decompression-bomb guard of :func:`~vitlab.data.images.decode.decode_image`.
    ``buffer_bytes`` is the memory budget of building a cache (``--memory-budget``): at most half
    of it holds decoded images waiting to be written to the cache file (at least one image), and an
    image that would take more than that half once resized is skipped; the other half is headroom for
    the decoders' own temporaries.
    ``max_side`` (without ``size`` or ``keep_aspect``): native images whose shorter side is longer are stored
    with that shorter side, aspect ratio kept (no crop), and mixed sizes are cropped to at most that side.
    Per-file bookkeeping (paths, labels, the list of kept files, image sizes) is not part of the budget.
    An existing cache is checked first (see the module's notes) and rebuilt when damaged; a cache
    that cannot be written (no space) is a :class:`CacheError`.
    """
    from ..._progress import ProgressLog

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a HOME that does not exist or cannot be written (a service account, a read-only image)
        raise CacheError(
            f"{cache}: cannot make the folder of the decode caches ({e.strerror or e}); pass --cache-dir DIR or "
            "set $VITLAB_CACHE to put them on a writable disk"
        ) from e
    layout = size if size is not None else f"aspect-{max_side}" if keep_aspect else f"native-or-{fallback_size}"
    if size is not None and crop not in (None, size):
        layout = f"{size}-crop{crop}"
    mode_key = mode + (f"|{max_pixels}" if max_pixels and max_pixels != DEFAULT_MAX_IMAGE_PIXELS else "")
    lines = _stat_lines(paths)
    files = hashlib.sha256(lines).hexdigest()[:20]  # the files alone, whatever the layout (twins share it)
    key = _key(
        paths,
        layout,
        mode_key + (f"|max{max_side}" if max_side is not None and size is None and not keep_aspect else ""),
        lines=lines,
    )
    chans = 3 if mode == "RGB" else 1
    max_bytes = buffer_bytes // 2
    stem = f"{name}-{key}"
    data_f, meta_f = cache / f"{stem}.u8", cache / f"{stem}.json"
    found = _open(
        data_f, meta_f, key=key, count=len(paths), chans=chans, buffer_bytes=buffer_bytes, max_bytes=max_bytes
    )
    if found is not None:
        return found

    layout = cache_layout(
        paths,
        size=size,
        fallback_size=fallback_size,
        max_side=max_side,
        keep_aspect=keep_aspect,
        max_pixels=max_pixels,
        name=name,
    )
    if layout.native:  # every image at its own size: a cache that stored them so (another max_side) is this one
        twin = _native_twin(
            cache, name, files=files, mode_key=mode_key, count=len(paths), chans=chans, buffer_bytes=buffer_bytes,
            max_bytes=max_bytes,
        )  # fmt: skip
        if twin is not None:
            return twin
    planned = [hw[0] * hw[1] * chans if hw is not None else 0 for hw in layout.shapes]
    held = [b if b <= max_bytes else 0 for b in planned]  # the decoder refuses a larger one from its header
    need = len(paths) * planned[0] if layout.uniform and paths else sum(held)
    make_room(cache, need, name=name, keep=[data_f])  # the cap: the least recently used caches no one reads go
    remove_stale(cache, f"{stem}.tmp")  # temp files of killed writers
    free = _free_bytes(cache)
    if free is not None and free < need:
        raise _no_space(cache, name, need, free)
    suffix = writer_suffix()
    tmp, tmp_meta = cache / f"{stem}.tmp{suffix}", cache / f"{stem}.tmp{suffix}.json"
    skipped: list[tuple[str, str]] = []
    kept: list[int] = []
    shapes: list[tuple[int, int]] = []
    crcs: list[int] = []
    ends: list[int] = []
    over = False

    def work(i: int) -> tuple[int, np.ndarray | None, str, bool]:
        try:
            arr = decode_image(
                paths[i],
                mode=mode,
                size=layout.size,
                crop=crop if layout.size == size else None,
                max_pixels=max_pixels,
                max_aspect=MAX_ASPECT,
                max_bytes=max_bytes,
                shorter_side=layout.shorter_side,
            )
            want = layout.shapes[i]
            if want is not None and arr.shape[:2] != want:
                return i, None, f"size {arr.shape[1]}x{arr.shape[0]} differs from {want[1]}x{want[0]}", False
            return i, np.ascontiguousarray(arr, dtype=np.uint8), "", False
        except OverBudget as e:  # recorded: a larger budget decodes it, so the cache is not used under one
            return i, None, f"ValueError: {e}", True
        except Exception as e:  # any unreadable file is reported, never fatal here
            return i, None, f"{type(e).__name__}: {e}", False

    # Executor.map would queue every file at once and could hold all decoded images; a bounded window cannot.
    # Half the budget: results can fill the whole window while this thread is descheduled; the rest is headroom.
    try:
        with open(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), "r+b") as f:
            _reserve(f.fileno(), need)
            crc, chunk = 0, 0
            with (
                ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
                ProgressLog(
                    total=len(paths), desc=f"decoding {name} (once)", unit="img", enabled=progress, leave=False
                ) as bar,
            ):
                for window in windows(held, max(1, max_bytes)):
                    for i, arr, err, too_big in pool.map(work, window):
                        over |= too_big
                        if arr is None:
                            skipped.append((paths[i], err))
                        else:
                            data = memoryview(arr).cast("B")
                            f.write(data)
                            crc, chunk = zlib.crc32(data, crc), chunk + len(data)
                            kept.append(i)
                            shapes.append(arr.shape[:2])
                            if chunk >= CHUNK_BYTES:
                                crcs.append(crc)
                                ends.append(len(kept))
                                crc, chunk = 0, 0
                        bar.update(1)
            if not ends or ends[-1] < len(kept):
                crcs.append(crc)
                ends.append(len(kept))
            f.truncate(f.tell())  # the reservation covered the skipped files too
            f.flush()
            os.fsync(f.fileno())
        meta = {
            "source": _source(paths),
            "version": _VERSION,
            "key": key,
            "dtype": "uint8",
            "count": len(paths),
            "kept": kept,
            "skipped": skipped,
            "chunk_ends": ends if kept else [],
            "crc32": crcs if kept else [],
            "max_bytes": max_bytes,
            "over_budget": over,
            "files": files,
            "mode_key": mode_key,
            "native": layout.native,
        }
        if layout.uniform or (shapes and len(set(shapes)) == 1):  # one size: an (N, H, W, C) array
            h, w = shapes[0] if shapes else layout.shapes[0] if layout.shapes and layout.shapes[0] else (1, 1)
            meta["shape"] = [len(kept), h, w, chans]
        else:
            meta.update(shape=[len(kept), 0, 0, chans], heights=[s[0] for s in shapes], widths=[s[1] for s in shapes])
        tmp_meta.write_text(json.dumps(meta))
        reader = open(tmp, "rb")  # noqa: SIM115  (held before it appears, and mapped below: no evictor takes it)
        hold(reader)
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
    named = None
    with contextlib.suppress(OSError):  # the cache by its name now (its lock held through ``reader`` meanwhile), so
        named = open(data_f, "rb")  # noqa: SIM115  (the map reports where it reads: data_f, not the temporary name)
        if not hold(named):
            named.close()
            named = None
    try:
        images = _mapped(named or reader, meta)
    finally:
        reader.close()
        if named is not None:
            named.close()
    return DecodedFiles(images, kept, skipped, data_f)
