"""One size cap for the decode caches of a cache folder, the least recently used dropped first.

The cap: ``$VITLAB_CACHE_MAX_SIZE`` (``20G``, ``none``), else the folder's ``cache-settings.json`` (written by
``vitlab cache limit SIZE``), else :data:`DEFAULT_MAX_BYTES`. The settings file is vitlab's own and read as data:
a regular file (never through a link) of at most :data:`SETTINGS_MAX_BYTES`, a JSON object ``{"max_size": N}``
(``N`` bytes in :data:`MIN_MAX_BYTES` .. 2**60, or ``null``: no cap); anything else is one warning line and the
default. It is written to a temporary file and renamed over the old one (a link there is replaced, not followed).

Eviction (:func:`make_room`) runs before a cache is built: while the caches and the one about to be built would
take more than the cap, the least recently used one is deleted (a cache's data file's modification time is its
last use: :func:`touch` on every open). It deletes only what vitlab wrote and no one uses:

- a decode cache is a pair ``<name>-<key>.u8`` + ``<name>-<key>.json``, both regular files (no link), the key 20
  hex digits that the metadata's ``key`` repeats, the metadata of a known shape (:func:`cache_entry`); any other
  file in the folder (downloads, the settings, a user's files) is neither counted nor touched;
- a cache in use is held: every process that reads one keeps a shared ``flock`` on its data file for as long as
  its memory map lives (:func:`hold`; inherited by forked data-loader workers, released by the kernel when the
  last of them exits, however it exits). Eviction takes the exclusive lock without waiting first; a cache it
  cannot lock is in use (or on a file system without ``flock``, where use cannot be told) and is kept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..._fs import NotAFile, TooLarge, atomic_write_text, read_small
from ..._units import format_size, parse_size
from ...errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_SIZE_ENV",
    "MIN_MAX_BYTES",
    "SETTINGS_MAX_BYTES",
    "SETTINGS_NAME",
    "CacheEntry",
    "Limit",
    "cache_entry",
    "cache_limit",
    "hold",
    "in_use",
    "make_room",
    "our_caches",
    "remove_cache",
    "set_cache_limit",
    "touch",
]

DEFAULT_MAX_BYTES = 20 << 30
"""The cap without a setting: 20 GiB, room for a few decodes of a 100k-photo folder at training sizes, small beside
the disks models are trained on (ccache keeps 5 GB, sccache 10 GiB)."""
MIN_MAX_BYTES = 1 << 20
"""The smallest cap a setting may give (1 MiB): below it every cache would be evicted at once."""
MAX_SIZE_ENV = "VITLAB_CACHE_MAX_SIZE"
SETTINGS_NAME = "cache-settings.json"
SETTINGS_MAX_BYTES = 4096
_STEM = re.compile(r"^(?P<name>.+)-(?P<key>[0-9a-f]{20})$")
_NO_CAP = ("none", "off", "unlimited")


@dataclass(frozen=True)
class CacheEntry:
    """One decode cache in a cache folder: its data file, bytes on disk (data + metadata), images, source folder,
    last use (the data file's modification time)."""

    path: Path
    bytes: int
    images: int
    source: str
    mtime: float


@dataclass(frozen=True)
class Limit:
    """The cap on a cache folder's decode caches (``None``: none) and where it comes from, in words."""

    max_bytes: int | None
    source: str
    warning: str | None = None
    """Why a setting was not taken (a bad file or variable), for one line to the user."""

    def describe(self) -> str:
        size = "no cap" if self.max_bytes is None else format_size(self.max_bytes)
        return f"{size} ({self.source})"


def _parse_cap(text: str, *, where: str) -> int | None:
    if text.strip().lower() in _NO_CAP:
        return None
    try:
        n = parse_size(text)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}, or none") from None
    return _checked(n, where=where)


def _checked(n: object, *, where: str) -> int | None:
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not MIN_MAX_BYTES <= n <= 1 << 60:
        raise ConfigError(f"{where}: the cap must be a size from {format_size(MIN_MAX_BYTES)} up, or none; got {n!r}")
    return n


def _read_settings(path: Path) -> int | None:
    """The cap the settings file states (raises :class:`ConfigError` naming the file for anything else)."""
    try:
        raw = read_small(path, limit=SETTINGS_MAX_BYTES, links=False)
    except FileNotFoundError:
        raise
    except NotAFile:
        raise ConfigError(f"{path}: not a regular file (a link or a folder); vitlab writes it itself") from None
    except TooLarge as e:
        raise ConfigError(f"{path}: {e.size:,} bytes, over the {SETTINGS_MAX_BYTES:,} of a settings file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{path}: not vitlab's cache settings ({e})") from None
    if not isinstance(body, dict) or set(body) != {"max_size"}:
        raise ConfigError(f'{path}: expected {{"max_size": BYTES or null}}')
    return _checked(body["max_size"], where=f"{path}: max_size")


def cache_limit(cache_dir: str | os.PathLike[str]) -> Limit:
    """The cap on the decode caches of ``cache_dir``: ``$VITLAB_CACHE_MAX_SIZE``, else the folder's settings file,
    else :data:`DEFAULT_MAX_BYTES`. A bad variable or file gives the default, with :attr:`Limit.warning` saying
    why (a cache is never refused for its setting)."""
    env = os.environ.get(MAX_SIZE_ENV)
    warning = None
    if env is not None and env.strip():
        try:
            return Limit(_parse_cap(env, where=f"${MAX_SIZE_ENV}"), f"${MAX_SIZE_ENV}")
        except ConfigError as e:
            warning = str(e)
    path = Path(cache_dir) / SETTINGS_NAME
    try:
        return Limit(_read_settings(path), str(path), warning)
    except FileNotFoundError:
        pass
    except ConfigError as e:
        warning = str(e)
    return Limit(DEFAULT_MAX_BYTES, "the default; vitlab cache limit SIZE to change it", warning)


def set_cache_limit(cache_dir: str | os.PathLike[str], text: str) -> Limit:
    """Write the cap ``text`` (``20G``, ``512MiB``, ``none``; ``default``: remove the setting) into ``cache_dir``'s
    settings file, atomically; returns the limit now in force."""
    folder = Path(cache_dir)
    path = folder / SETTINGS_NAME
    if text.strip().lower() == "default":
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(path).st_mode):
                raise ConfigError(f"{path}: a folder, not vitlab's settings file; not removed")
            path.unlink()
        return cache_limit(folder)
    cap = _parse_cap(text, where="vitlab cache limit")
    folder.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        raise ConfigError(f"{path}: a folder, not vitlab's settings file; not replaced")
    atomic_write_text(path, json.dumps({"max_size": cap}) + "\n")
    return cache_limit(folder)


def cache_entry(meta_f: Path) -> CacheEntry | None:
    """The decode cache whose metadata is ``meta_f``, or None when the pair is not one vitlab wrote: the names
    ``<name>-<20 hex>.json`` / ``.u8``, both regular files (a link is never taken for one), the metadata a JSON
    object whose ``key`` is the name's, with a version, a shape and a source."""
    m = _STEM.match(meta_f.stem) if meta_f.suffix == ".json" else None
    if m is None:
        return None
    data_f = meta_f.with_suffix(".u8")
    try:
        st_meta, st_data = os.lstat(meta_f), os.lstat(data_f)
    except OSError:
        return None
    if not (stat.S_ISREG(st_meta.st_mode) and stat.S_ISREG(st_data.st_mode)) or st_meta.st_size > 1 << 30:
        return None
    try:
        meta = json.loads(meta_f.read_bytes())
        images = int(meta["shape"][0])
        ours = meta["key"] == m.group("key") and isinstance(meta["version"], int) and isinstance(meta["count"], int)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if not ours:
        return None
    source = meta.get("source", "")
    return CacheEntry(data_f, st_data.st_size + st_meta.st_size, images, str(source), st_data.st_mtime)


def our_caches(cache_dir: str | os.PathLike[str]) -> list[CacheEntry]:
    """The decode caches vitlab wrote under ``cache_dir`` (:func:`cache_entry`), least recently used first."""
    cache = Path(cache_dir)
    found = [e for f in (cache.glob("*.json") if cache.is_dir() else ()) if (e := cache_entry(f)) is not None]
    return sorted(found, key=lambda e: (e.mtime, e.path.name))


def touch(data_f: Path) -> None:
    """Mark a cache as just used (its data file's modification time): the least recently used go first."""
    with contextlib.suppress(OSError):  # a cache folder shared read-only: it is still used, only not marked
        os.utime(data_f)


def hold(f: IO[bytes]) -> bool:
    """Take a shared lock on an open cache data file, without waiting: the memory map made from ``f`` keeps it (its
    own copy of the descriptor) for as long as it lives. False when an evictor holds the exclusive lock (the cache
    is being deleted: decode again); True otherwise (also where the file system has no ``flock``)."""
    import fcntl

    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    return True


@contextlib.contextmanager
def _unused(data_f: Path):
    """Yields whether ``data_f`` is used by no one (the exclusive lock, held while the body runs)."""
    import fcntl

    try:
        fd = os.open(data_f, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held by a reader, or no flock here: cannot tell, so in use
            yield False
            return
        yield True
    finally:
        os.close(fd)


def in_use(data_f: Path) -> bool:
    """Whether a process (this one included) reads the cache ``data_f`` now (:func:`hold`)."""
    with _unused(data_f) as free:
        return not free


def remove_cache(entry: CacheEntry) -> None:
    """Delete a cache: the metadata first, so no half cache ever looks complete."""
    entry.path.with_suffix(".json").unlink(missing_ok=True)
    entry.path.unlink(missing_ok=True)


def make_room(
    cache_dir: str | os.PathLike[str], need: int, *, name: str = "images", keep: Iterable[Path] = ()
) -> list[CacheEntry]:
    """Before a cache of ``need`` bytes is built in ``cache_dir``: delete the least recently used decode caches
    that no process uses (never ``keep``) until the caches and the new one fit the cap (:func:`cache_limit`).
    Returns what was deleted; says so on stderr in one line, and in another when even then they do not fit (the
    new cache is built anyway: the run needs it)."""
    limit = cache_limit(cache_dir)
    if limit.warning:
        print(f"warning: {limit.warning}; the decode caches' cap is the default", file=sys.stderr)
    if limit.max_bytes is None:
        return []
    caches = our_caches(cache_dir)
    total = sum(e.bytes for e in caches)
    if total + need <= limit.max_bytes:
        return []
    skip = {Path(p).resolve() for p in keep}
    gone: list[CacheEntry] = []
    for e in caches:
        if total + need <= limit.max_bytes:
            break
        if e.path.resolve() in skip:
            continue
        with _unused(e.path) as free:
            if free and cache_entry(e.path.with_suffix(".json")) is not None:  # (still ours, now locked)
                remove_cache(e)
                gone.append(e)
                total -= e.bytes
    if gone:
        print(
            f"decode cache: deleted {len(gone)} least recently used cache(s) under {cache_dir}, "
            f"{format_size(sum(e.bytes for e in gone))}, to keep the caches within the cap of {limit.describe()}",
            file=sys.stderr,
        )
    if total + need > limit.max_bytes:
        print(
            f"note: the decode caches under {cache_dir} take {format_size(total + need)} with {name}, over the cap "
            f"of {limit.describe()}; the rest are in use or needed now (vitlab cache ls)",
            file=sys.stderr,
        )
    return gone
