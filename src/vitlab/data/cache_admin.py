"""The decode caches a machine holds: ``vitlab cache ls`` and ``vitlab cache clear``, and the one line a
run prints about its cache (where, how big). The caches themselves are written and checked by
:mod:`vitlab.data.cache`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._units import format_size
from .cache import default_cache_dir

__all__ = ["CacheEntry", "cache_line", "clear_caches", "list_caches"]


@dataclass(frozen=True)
class CacheEntry:
    """One decode cache in a cache folder: its data file, bytes on disk, images, source folder, last write."""

    path: Path
    bytes: int
    images: int
    source: str
    mtime: float


def list_caches(cache_dir: str | os.PathLike[str] | None = None) -> list[CacheEntry]:
    """The decode caches under ``cache_dir`` (default :func:`default_cache_dir`), newest first: every
    ``<name>-<key>.u8`` with its ``.json`` metadata. Other files there (downloads, build caches) are
    not decode caches and are never listed."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entries = []
    for meta_f in cache.glob("*.json") if cache.is_dir() else ():
        data_f = meta_f.with_suffix(".u8")
        if not data_f.is_file():
            continue
        try:
            meta = json.loads(meta_f.read_bytes())
            images = int(meta["shape"][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        st = data_f.stat()
        size = st.st_size + meta_f.stat().st_size
        entries.append(CacheEntry(data_f, size, images, str(meta.get("source", "")), st.st_mtime))
    return sorted(entries, key=lambda e: -e.mtime)


def clear_caches(
    cache_dir: str | os.PathLike[str] | None = None, *, older_than: float | None = None, now: float | None = None
) -> list[CacheEntry]:
    """Delete the decode caches under ``cache_dir`` (all, or those last written more than ``older_than``
    seconds before ``now``) and return them. A cache in use by a running job stays readable by it
    (its memory map holds the file) and is decoded again by the next run that needs it."""
    import time

    now = time.time() if now is None else now
    gone = []
    for e in list_caches(cache_dir):
        if older_than is not None and now - e.mtime <= older_than:
            continue
        e.path.with_suffix(".json").unlink(missing_ok=True)  # the metadata first: no half cache looks complete
        e.path.unlink(missing_ok=True)
        gone.append(e)
    return gone


def cache_line(files: Sequence[str | os.PathLike[str]]) -> str | None:
    """One line telling where the decode cache ``files`` are and how big they are (``None`` for none):
    the cache lives outside the run's folder and outlives it, so the user is told once per run."""
    paths = [Path(f) for f in files]
    sizes = [p.stat().st_size for p in paths if p.is_file()]
    if not sizes:
        return None
    where = sorted({str(p.parent) for p in paths})
    return (
        f"decode cache: {format_size(sum(sizes))} in {len(sizes)} file(s) under {', '.join(where)} "
        "(vitlab cache ls; vitlab cache clear)"
    )
