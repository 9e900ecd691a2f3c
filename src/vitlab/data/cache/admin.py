"""The decode caches a machine holds: ``vitlab cache ls``, ``vitlab cache clear`` (and ``limit``:
:mod:`.limit`), and the one line a run prints about its cache (where, how big). The caches themselves are
written and checked by :mod:`vitlab.data.cache.store`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..._units import format_size
from .limit import CacheEntry, cache_limit, our_caches, remove_cache
from .store import default_cache_dir

__all__ = ["CacheEntry", "cache_line", "clear_caches", "list_caches"]


def list_caches(cache_dir: str | os.PathLike[str] | None = None) -> list[CacheEntry]:
    """The decode caches under ``cache_dir`` (default :func:`default_cache_dir`), most recently used first: every
    ``<name>-<key>.u8`` with its ``.json`` metadata that vitlab wrote (:func:`.limit.cache_entry`). Other
    files there (downloads, build caches, the settings, links) are not decode caches and are never listed."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return our_caches(cache)[::-1]


def clear_caches(
    cache_dir: str | os.PathLike[str] | None = None, *, older_than: float | None = None, now: float | None = None
) -> list[CacheEntry]:
    """Delete the decode caches under ``cache_dir`` (all, or those last used more than ``older_than``
    seconds before ``now``) and return them. A cache in use by a running job stays readable by it
    (its memory map holds the file) and is decoded again by the next run that needs it."""
    import time

    now = time.time() if now is None else now
    gone = []
    for e in list_caches(cache_dir):
        if older_than is not None and now - e.mtime <= older_than:
            continue
        remove_cache(e)  # the metadata first: no half cache looks complete
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
    cap = cache_limit(where[0]).max_bytes
    capped = f"; the caches there are capped at {format_size(cap)}, vitlab cache limit" if cap is not None else ""
    return (
        f"decode cache: {format_size(sum(sizes))} in {len(sizes)} file(s) under {', '.join(where)} "
        f"(vitlab cache ls; vitlab cache clear{capped})"
    )
