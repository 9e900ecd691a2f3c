"""The data check's one pass over the files: each file read once, its bytes hashed (BLAKE2b, for exact copies) and
decoded by the one decoder (:func:`~vitlab.data.images.decode.decode_encoded`, a JPEG at a reduced DCT scale: the
fingerprint only needs 32x32) for its size and perceptual fingerprint (:func:`.perceptual.fingerprint`), in a few
threads (PIL's decoders and the hash release the GIL), a bounded window of files in flight.

Files are data: each is read once, at most :data:`MAX_READ_BYTES` into memory (a larger one is hashed in chunks and
decoded from its path), never executed; a file the decoder refuses (empty, truncated, not an image, a decompression
bomb) is recorded with its reason. What one pass learnt is kept in the decode cache's folder
(``datacheck-<key>.hashes.json``), each file's entry keyed by its path, size and modification time as the decode
cache keys its files, so a second run (or ``vitlab data check`` after a run) reads only what changed (and the files
that could not be used: their permissions may have changed)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..._fs import atomic_write_text
from ..images.decode import DEFAULT_MAX_IMAGE_PIXELS, decode_encoded, decode_image, file_kind, image_size
from .perceptual import THUMB_SIDE, Fingerprint, fingerprint

__all__ = ["DECODE_SIDE", "MAX_READ_BYTES", "FileRecord", "Fingerprints", "KeptHashes", "kept_hashes", "read_files"]

DECODE_SIDE = 64
"""A JPEG is decoded at the smallest DCT scale that keeps both sides at least this long (the fingerprint shrinks it
to 32x32 anyway): a quarter or an eighth of the work of a full decode for a phone photo."""
MAX_READ_BYTES = 256 << 20
"""The most bytes of one file held in memory; a larger file is hashed in chunks and decoded from its path."""
_VERSION = 2  # of the hashes file: a new fingerprint or entry layout makes a new file
_CHUNK = 1 << 20
_WINDOW = 256  # files in flight at most
_THUMB_BYTES = 2 * THUMB_SIDE * THUMB_SIDE * 3
_BYTES_IO = re.compile(r" ?<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


@dataclass
class FileRecord:
    """One image file of the checked folder: ``path`` as the folder walk found it, ``rel`` relative to the checked
    folder (readable text, ``/`` separators), its ``split`` folder and class index ``label``; after the pass, its
    ``size`` ``(width, height)`` (EXIF orientation applied), content ``digest`` and, for a file that cannot be
    decoded, the ``error``."""

    path: str
    rel: str
    split: str
    label: int
    size: tuple[int, int] | None = None
    digest: str | None = None
    error: str | None = None


@dataclass
class Fingerprints:
    """The perceptual fingerprints of the records, row ``i`` for record ``i`` (rows of unreadable files are zeros):
    ``whole``, ``centre`` and ``mirror`` hashes ``(N,)`` uint64, ``thumbs`` ``(N, 2, 16, 16, 3)`` uint8."""

    whole: np.ndarray
    centre: np.ndarray
    thumbs: np.ndarray
    mirror: np.ndarray

    @classmethod
    def empty(cls, n: int) -> Fingerprints:
        thumbs = np.zeros((n, 2, THUMB_SIDE, THUMB_SIDE, 3), np.uint8)
        return cls(np.zeros(n, np.uint64), np.zeros(n, np.uint64), thumbs, np.zeros(n, np.uint64))

    def set(self, i: int, fp: Fingerprint) -> None:
        self.whole[i], self.centre[i], self.thumbs[i], self.mirror[i] = fp.whole, fp.centre, fp.thumbs, fp.mirror


def _reason(e: BaseException) -> str:
    """A decoder's error as a reason (PIL names an in-memory file by its object's address: dropped)."""
    text = _BYTES_IO.sub("", str(e).strip().splitlines()[0] if str(e).strip() else "")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _read(path: str, max_pixels: int | None) -> tuple[str, tuple[int, int], Fingerprint]:
    """``(digest, size, fingerprint)`` of one file, reading it once; raises with the reason it cannot be used."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"not a regular file ({file_kind(st.st_mode)}); not opened")
    if st.st_size == 0:
        raise ValueError("empty file (0 bytes)")
    h = hashlib.blake2b(digest_size=16)
    if st.st_size <= MAX_READ_BYTES:
        with open(path, "rb") as f:
            data = f.read(MAX_READ_BYTES)
        if not data:
            raise ValueError("empty file (0 bytes)")
        h.update(data)
        pixels = decode_encoded(data, mode="RGB", max_pixels=max_pixels, at_least=(DECODE_SIDE, DECODE_SIDE))
        size = image_size(io.BytesIO(data))
    else:  # held in chunks, decoded from the path (rare: a scan of several hundred megabytes)
        with open(path, "rb") as f:
            for _ in range(st.st_size // _CHUNK + 1):
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                h.update(chunk)
        pixels = decode_image(path, shorter_side=DECODE_SIDE, max_pixels=max_pixels)
        size = image_size(path)
    if size is None:  # (the decoder read it, so the header reads: only a file changed meanwhile)
        size = (int(pixels.shape[1]), int(pixels.shape[0]))
    return h.hexdigest(), size, fingerprint(pixels)


# -- what a pass learnt, kept for the next -----------------------------------------------------------------------


def _hashes_file(cache_dir: Path, root: Path, max_pixels: int | None) -> Path:
    key = f"v{_VERSION}|{os.path.realpath(root)}|{max_pixels or DEFAULT_MAX_IMAGE_PIXELS}"
    return cache_dir / f"datacheck-{hashlib.sha256(os.fsencode(key)).hexdigest()[:20]}.hashes.json"


_HASHES_NAME = re.compile(r"datacheck-[0-9a-f]{20}\.hashes\.json")
_MARKER = b'{"vitlab_data_check_hashes": '


@dataclass(frozen=True)
class KeptHashes:
    """One file of hashes a check kept in a cache folder: its path, bytes and last write."""

    path: Path
    bytes: int
    mtime: float


def kept_hashes(cache_dir: str | os.PathLike[str]) -> list[KeptHashes]:
    """The hashes files data checks kept under ``cache_dir`` (of any version, an older vitlab's too), least recently
    written first: named ``datacheck-<20 hex>.hashes.json``, a regular file (never a link) that begins as one is
    written. ``vitlab cache ls`` counts them and ``vitlab cache clear`` deletes them: the next check reads its files
    again. Nothing else is ever taken for one."""
    found = []
    folder = Path(cache_dir)
    for f in folder.glob("datacheck-*.hashes.json") if folder.is_dir() else ():
        try:
            st = os.lstat(f)
            if not (_HASHES_NAME.fullmatch(f.name) and stat.S_ISREG(st.st_mode)):
                continue
            with open(f, "rb") as fh:
                if fh.read(len(_MARKER)) != _MARKER:
                    continue
        except OSError:
            continue
        found.append(KeptHashes(f, st.st_size, st.st_mtime))
    return sorted(found, key=lambda k: (k.mtime, k.path.name))


def _stat_key(path: str) -> str | None:
    """The key a file's entry is kept under: its absolute path, size and modification time (the decode cache's)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}"


def _entry(value: object) -> tuple[str, tuple[int, int], Fingerprint] | None:
    """A kept entry ``[digest, width, height, whole, centre, thumbs, mirror]`` checked, or None when it is not one."""
    if not (isinstance(value, list) and len(value) == 7):
        return None
    digest, w, h, whole, centre, thumbs, mirror = value
    try:
        raw = base64.b64decode(thumbs, validate=True) if isinstance(thumbs, str) else b""
    except ValueError:
        return None
    ok = (
        isinstance(digest, str)
        and re.fullmatch(r"[0-9a-f]{32}", digest) is not None
        and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (w, h))
        and all(isinstance(x, str) and re.fullmatch(r"[0-9a-f]{16}", x) for x in (whole, centre, mirror))
        and len(raw) == _THUMB_BYTES
    )
    if not ok:
        return None
    t = np.frombuffer(raw, dtype=np.uint8).reshape(2, THUMB_SIDE, THUMB_SIDE, 3).copy()
    return digest, (w, h), Fingerprint(int(whole, 16), int(centre, 16), t, int(mirror, 16))


def _load_kept(path: Path, n_files: int) -> dict[str, list]:
    """The entries a previous pass kept in ``path`` (an empty dict when there is none, or it is not one vitlab wrote):
    a regular file (never through a link) read up to a bound that grows with the number of files."""
    limit = (n_files + 16) * 4096
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return {}
        with open(path, "rb") as f:
            doc = json.loads(f.read(limit))
    except (OSError, ValueError, RecursionError):
        return {}
    if not (isinstance(doc, dict) and doc.get("vitlab_data_check_hashes") == _VERSION):
        return {}
    files = doc.get("files")
    return files if isinstance(files, dict) else {}


KEEP_MARGIN = 64 << 20
"""Free space the cache folder must keep beyond the hashes file for the check to write it: a folder short of room is
the decode cache's to report (in one line, before any decoding), not filled further by what is only a shortcut."""


def _keep(path: Path, entries: dict[str, list]) -> None:
    """Write what this pass learnt (atomically) where there is room (:data:`KEEP_MARGIN`); a cache folder that is
    short of room or cannot be written is left as it is: the next pass reads the files again."""
    text = json.dumps({"vitlab_data_check_hashes": _VERSION, "files": entries})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(path.parent).free < len(text) + KEEP_MARGIN:
            return
        atomic_write_text(path, text)
    except OSError:
        pass


def read_files(
    records: Sequence[FileRecord],
    *,
    root: Path,
    workers: int = 2,
    progress: bool = True,
    max_pixels: int | None = None,
    cache_dir: Path | None = None,
) -> Fingerprints:
    """Read every record's file once (see the module's notes): fill in its ``size``, ``digest`` or ``error``, and
    return the fingerprints. ``cache_dir``: where the entries of the previous pass over ``root`` are read and this
    pass's written (None: none kept)."""
    from ..._progress import ProgressLog

    fps = Fingerprints.empty(len(records))
    kept_file = _hashes_file(cache_dir, root, max_pixels) if cache_dir is not None else None
    kept = _load_kept(kept_file, len(records)) if kept_file is not None else {}
    keys = [_stat_key(r.path) for r in records]
    todo = []
    for i, (rec, key) in enumerate(zip(records, keys)):
        got = _entry(kept.get(key)) if key is not None else None
        if got is None:
            todo.append(i)
            continue
        rec.digest, rec.size, fp = got
        fps.set(i, fp)

    def work(i: int) -> tuple[int, tuple[str, tuple[int, int], Fingerprint] | None, str]:
        try:
            return i, _read(records[i].path, max_pixels), ""
        except Exception as e:  # any file that cannot be used is a finding, never fatal here
            return i, None, _reason(e)

    with (
        ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
        ProgressLog(total=len(todo), desc="checking the data", unit="img", enabled=progress, leave=False) as bar,
    ):
        for start in range(0, len(todo), _WINDOW):
            for i, got, why in pool.map(work, todo[start : start + _WINDOW]):
                rec = records[i]
                if got is None:
                    rec.error = why
                else:
                    rec.digest, rec.size, fp = got
                    fps.set(i, fp)
                bar.update(1)
    if kept_file is not None and (todo or len(kept) != len(records)):
        entries = {}
        for i, (rec, key) in enumerate(zip(records, keys)):
            if key is None or rec.error is not None or rec.size is None:
                continue  # a file that cannot be used is read again next time (its permissions may change)
            w, h = rec.size
            thumbs = base64.b64encode(fps.thumbs[i].tobytes()).decode("ascii")
            whole, centre, mirror = (f"{int(a[i]):016x}" for a in (fps.whole, fps.centre, fps.mirror))
            entries[key] = [rec.digest, w, h, whole, centre, thumbs, mirror]
        _keep(kept_file, entries)
    return fps
