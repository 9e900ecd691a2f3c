"""Which tar shards a ``--data`` value names, how many samples each holds, and how to read them.

Three spellings name shards (the format ``vitlab data pack`` writes, :mod:`vitlab.data.shards.write`, which is
WebDataset's: ``<key>.<ext>`` + ``<key>.cls`` members):

- a folder with ``manifest.json``: its ``train`` split and its evaluation split (``val``, ``test`` ...);
- a brace pattern or list, ``shards/train-{000000..000123}.tar`` (``::`` joins several), expanded by
  ``webdataset`` as its own readers expand it; also URLs it opens (``https://``, ``gs://`` ...; ``pipe:``, which
  runs a shell command, only when the caller passes ``allow_pipe``: :mod:`vitlab.data.shards.names`).
  The ``manifest.json`` beside the first shard gives the sample counts and class names; local shards
  without one are counted by reading their tar headers once (classes are then named by their index);
- the evaluation split is the manifest's other split, else the last shards held out (``--val-split``).

The reader needs every shard's sample count before it starts (the epoch's order is arithmetic over the
counts, :mod:`vitlab.data.shards.stream`). Local shards are opened seekable, so the members a process does not
need are skipped without being read; URLs are streamed (``webdataset.gopen``), read through to the end.

What a shard holds is data, checked as it is read: a member over :data:`MAX_MEMBER_BYTES` is refused before it is
read, a shard holding more or fewer samples than it was counted to hold is an error at its end, a shard that is
empty, truncated, compressed or no tar at all is a one-line :class:`~vitlab.errors.DataError` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import DataError
from ..images.decode import HEIF_EXTENSIONS, IMAGE_EXTENSIONS
from .manifest import MANIFEST, MAX_CLASSES, MAX_MANIFEST_BYTES, parse_manifest, read_manifest
from .names import check_scheme, expand_spec, quoted, url_scheme

__all__ = [
    "MAX_MEMBER_BYTES",
    "Shard",
    "ShardSet",
    "ShardSource",
    "is_shard_spec",
    "iter_samples",
    "open_shard",
    "open_source",
]

MAX_MEMBER_BYTES = 64 << 20
"""Largest tar member (one sample's image) read: a larger one is refused before it is read."""
_KEY = re.compile(r"^((?:.*/|)[^/.]+)\.([^/]*)$")  # webdataset's split: the key ends at the basename's first dot
_EVAL_NAMES = ("val", "valid", "validation", "test")
_IMAGE_EXTS = {e.lstrip(".") for e in (*IMAGE_EXTENSIONS, *HEIF_EXTENSIONS)} | {"img"}  # (HEIF: the decoder says
# which extra reads it where it is missing)
_LABEL = re.compile(rb"^\s*(-?\d{1,18})\s*$")
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _is_url(s: str) -> bool:
    return url_scheme(s) is not None


def is_shard_spec(spec: str) -> bool:
    """Whether ``--data spec`` names tar shards: a folder holding ``manifest.json``, a ``.tar`` path or
    pattern (``{a..b}`` braces, ``::`` lists), or a URL (``hf:NAME``, a Hugging Face data set, is not one)."""
    s = spec.strip()
    if s.lower().startswith("hf:") and not s.startswith("hf://"):  # a Hugging Face data set name: not built
        return False
    if _is_url(s) or (".tar" in s and ("{" in s or "::" in s or s.endswith(".tar"))):
        return True
    try:
        p = Path(s).expanduser()
        return p.is_dir() and (p / MANIFEST).is_file()
    except (OSError, RuntimeError):  # a name too long to be a path; no home folder for ~
        return False


@dataclass(frozen=True)
class Shard:
    url: str
    """A local path or a URL ``webdataset.gopen`` opens."""
    samples: int
    sha256: str | None = None


@dataclass(frozen=True)
class ShardSet:
    """The shards of one split, in their given order."""

    shards: tuple[Shard, ...] = ()

    def __len__(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def counts(self) -> list[int]:
        return [s.samples for s in self.shards]


@dataclass(frozen=True)
class ShardSource:
    """A ``--data`` value resolved to shards: the training and evaluation splits and the class names."""

    name: str
    classes: list[str]
    train: ShardSet
    val: ShardSet
    val_name: str

    def fingerprint(self) -> dict[str, object]:
        """What ``--resume`` compares (the shape of :func:`vitlab.train.engine.run_data.data_fingerprint`): per split,
        its samples and a digest of its shards' names, counts and checksums."""

        def key(s: ShardSet) -> str:
            rows = [[Path(sh.url).name, sh.samples, sh.sha256] for sh in s.shards]
            return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]

        splits = {"train": self.train, self.val_name: self.val}
        return {"classes": self.classes, "splits": {n: {"files": len(s), "key": key(s)} for n, s in splits.items()}}


def _not_a_shard(url: str, why: str) -> DataError:
    return DataError(f"{quoted(url)}: {why}")


def open_shard(url: str) -> tarfile.TarFile:
    """A shard opened for reading: a local file seekable (members not read are skipped by a seek), a URL
    as a stream through ``webdataset.gopen``. An empty, compressed or non-tar file is a one-line
    :class:`DataError` naming it. The scheme of ``url`` was checked where it was named (:func:`open_source`)."""
    if _is_url(url) and not url.startswith("file:"):
        try:
            return tarfile.open(fileobj=_gopen(url), mode="r|")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise _not_a_shard(url, f"not a readable tar stream ({type(e).__name__}: {_first_line(e)})") from None
    path = url.removeprefix("file:")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise _not_a_shard(url, "not a regular file (a tar shard is a file)")
        if st.st_size == 0:
            raise _not_a_shard(url, "an empty file (0 bytes), not a tar shard")
        return tarfile.open(path, "r:")
    except (tarfile.TarError, EOFError) as e:
        raise _not_a_shard(url, _why_not_tar(path, e)) from None
    except OSError as e:
        raise _not_a_shard(url, f"cannot open ({e.strerror or e})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:120] if text else type(e).__name__


def _why_not_tar(path: str, e: BaseException) -> str:
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError:
        magic = b""
    kind = next((k for m, k in _COMPRESSED.items() if magic.startswith(m)), None)
    if kind is not None:
        return f"a {kind}-compressed file: vitlab reads uncompressed .tar shards (decompress it, or repack)"
    if str(e) == "empty file":
        return "holds no members (an empty tar)"
    return f"not a tar file, or truncated ({_first_line(e)})"


def iter_samples(
    tar: tarfile.TarFile,
    want: Callable[[int], bool],
    *,
    exts: set[str] | None = None,
    count: int | None = None,
    where: str | None = None,
    max_member: int = MAX_MEMBER_BYTES,
) -> Iterator[tuple[int, str, dict[str, bytes] | None]]:
    """``(index, key, members)`` of each sample of an open shard, in order: consecutive members sharing a key
    (WebDataset's grouping). ``members`` (extension -> bytes; only ``exts`` when given) is read for the samples
    ``want(index)`` asks for, None for the others, which are never read. ``want`` is asked as a sample's first
    member is reached, so it must answer for any index at any time.

    ``count``: the samples the shard should hold (its manifest's number, or a first reading's). A sample beyond
    it, or the end of the shard before it, is a :class:`DataError`; a sample is yielded only once the next one
    has begun or the shard has ended, so a reader that takes the shard's last sample has checked its count.
    A member over ``max_member`` bytes is refused before it is read; a truncated or damaged tar is a one-line
    :class:`DataError`. ``where`` names the shard in errors (default: the tar's file name)."""
    where = quoted(where or str(tar.name or "shard"))
    index, key, parts = -1, None, None
    members = iter(tar)
    try:
        while True:
            try:
                m = next(members)
            except StopIteration:
                break
            tar.members = []  # no growing list of every member seen
            match = _KEY.match(m.name)
            if not m.isfile() or match is None or Path(m.name).name.startswith("__"):
                continue
            k, ext = match.groups()
            if k != key:
                if count is not None and index + 1 >= count:
                    raise DataError(
                        f"{where}: holds more than the {count:,} samples it was counted to hold "
                        "(its manifest under-counts it, or it changed); repack it or fix the manifest"
                    )
                if key is not None:
                    yield index, key, parts
                index, key = index + 1, k
                parts = {} if want(index) else None
            if parts is not None and (exts is None or ext.lower() in exts):
                if m.size > max_member:
                    raise DataError(
                        f"{where}: {quoted(m.name, 80)} is {m.size:,} bytes, over the {max_member:,} bytes "
                        "read for one member of a sample"
                    )
                f = tar.extractfile(m)
                parts[ext.lower()] = f.read() if f is not None else b""
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{where}: truncated or damaged tar ({_first_line(e)})") from None
    if count is not None and index + 1 != count:
        raise DataError(
            f"{where}: holds {index + 1:,} samples, not the {count:,} it was counted to hold "
            "(truncated, or its manifest over-counts it)"
        )
    if key is not None:
        yield index, key, parts


def image_and_label(parts: dict[str, bytes], *, where: str) -> tuple[bytes, int]:
    """A sample's encoded image and class index; a :class:`DataError` naming ``where`` when one is missing."""
    image = next((v for e, v in parts.items() if e in _IMAGE_EXTS), None)
    if image is None or "cls" not in parts:
        raise DataError(
            f"{where}: no {'image' if image is None else '.cls'} member (a sample is <key>.jpg + <key>.cls)"
        )
    m = _LABEL.match(parts["cls"])
    if m is None:
        raise DataError(f"{where}: the .cls member is not an integer class index")
    return image, int(m.group(1))


def _gopen(url: str):
    """``webdataset.gopen``, which runs a ``pipe:`` URL through the shell: every URL reaching it was checked where it
    was named (:mod:`vitlab.data.shards.names`: http(s)/file always, ``pipe:`` only when ``--allow-pipe`` was typed on
    this command line, never from a saved run or a manifest; tests/test_reliability_shards.py,
    ``test_a_pipe_in_last_pt_never_runs``, ``test_pipes_and_unknown_schemes_anywhere_in_a_data_value_are_refused``)."""
    try:
        from webdataset import gopen
    except ImportError:
        raise DataError(f"{url}: reading shards from URLs needs webdataset: pip install 'vitlab[stream]'") from None
    try:
        return gopen(url)
    except Exception as e:
        raise DataError(f"{quoted(url)}: cannot open ({type(e).__name__}: {_first_line(e)})") from None


def _base(url: str) -> str:
    return url.rsplit("/", 1)[0] if "/" in url else "."


def _join(base: str, name: str) -> str:
    return str(Path(base) / name) if not _is_url(base) else f"{base}/{name}"


def _manifest_at(base: str) -> dict | None:
    """The manifest of the folder or URL ``base`` (checked as :func:`read_manifest` checks one), or None
    when there is none (a URL that cannot be fetched counts as none)."""
    if not _is_url(base):
        return read_manifest(base) if (Path(base) / MANIFEST).is_file() else None
    url = _join(base, MANIFEST)
    try:
        with _gopen(url) as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except Exception:
        return None
    return parse_manifest(raw, quoted(url)) if raw else None


def _split_sets(m: dict, base: str) -> dict[str, ShardSet]:
    """The manifest's splits (its names were checked to be plain file names: :func:`check_manifest`)."""
    sets = {}
    for split, s in m["splits"].items():
        shards = (Shard(_join(base, sh["name"]), sh["samples"], sh["sha256"]) for sh in s["shards"])
        sets[split] = ShardSet(tuple(shards))
    return sets


def _scan(url: str) -> tuple[int, set[int]]:
    """``(samples, class indices)`` of a local shard, from its headers and ``.cls`` members."""
    labels, n = set(), 0
    with open_shard(url) as tar:
        for i, key, parts in iter_samples(tar, lambda i: True, exts={"cls"}, where=url):
            if "cls" not in parts:
                raise DataError(f"{quoted(url)}: sample {quoted(key, 80)} has no .cls member")
            m = _LABEL.match(parts["cls"])
            label = int(m.group(1)) if m is not None else -1
            if not 0 <= label < MAX_CLASSES:
                raise DataError(
                    f"{quoted(url)}: sample {quoted(key, 80)}: the .cls member is not a class index from 0 to "
                    f"{MAX_CLASSES - 1:,} (shards without a {MANIFEST} name their classes by index)"
                )
            labels.add(label)
            n = i + 1
    if n == 0:
        raise DataError(f"{quoted(url)}: holds no samples (a sample is <key>.jpg + <key>.cls)")
    return n, labels


def _hold_out(train: ShardSet, fraction: float | None, *, name: str) -> tuple[ShardSet, ShardSet]:
    """The last shards as the evaluation split (``fraction`` of them, default 0.1, at least one)."""
    n = len(train.shards)
    k = max(1, round((fraction or 0.1) * n))
    if n - k < 1:
        raise DataError(
            f"--data {name}: {n} shard(s) and no evaluation split: pack a folder with val/ (or test/), "
            "or into more shards (--shard-size), so that whole shards can be held out"
        )
    return ShardSet(train.shards[: n - k]), ShardSet(train.shards[n - k :])


def _same_folder(a: str, b: str) -> bool:
    """Whether two shards' folders are one (local folders by their real path, URLs by their text)."""
    if _is_url(a) or _is_url(b):
        return a == b
    return os.path.realpath(a) == os.path.realpath(b)


def _folder(s: str) -> Path | None:
    if _is_url(s):
        return None
    try:
        p = Path(s).expanduser()
        return p if p.is_dir() else None
    except (OSError, RuntimeError):
        return None


def open_source(
    spec: str, *, val_split: float | None = None, eval_only: bool = False, allow_pipe: bool = False
) -> ShardSource:
    """Resolve ``--data spec`` (:func:`is_shard_spec`) to its shards. ``eval_only`` (``vitlab eval``): a pattern's
    shards are the evaluation split themselves; a folder's evaluation split is its own.

    ``spec`` is checked as :func:`~vitlab.data.shards.names.expand_spec` checks it whoever wrote it: ``pipe:`` URLs
    (a shell command) only with ``allow_pipe`` (the caller's word that the value was typed on the command line
    with ``--allow-pipe``), other schemes from a fixed list, at most a million names, no shard twice."""
    s = spec.strip()
    shown = quoted(spec)
    folder = _folder(s)
    if folder is not None:
        m, base, urls = read_manifest(folder), str(folder), None
    else:
        urls = expand_spec(s, allow_pipe=allow_pipe)
        base = _base(urls[0])
        check_scheme(base, allow_pipe=allow_pipe, where=f"--data {shown}")
        if not _is_url(urls[0]):
            missing = [u for u in urls if not Path(u).is_file()]
            if missing:
                raise DataError(
                    f"--data {shown}: {len(missing)} shard(s) missing (or not files), e.g. {quoted(missing[0])}"
                )
        m = _manifest_at(base)
    name = Path(base).name if not _is_url(base) else base.rsplit("/", 1)[-1]
    if m is not None:
        sets = _split_sets(m, base)
        classes = list(m["classes"])
        if urls is None:
            split = "train"
        else:
            by_name = {Path(sh.url).name: (sp, sh) for sp, st in sets.items() for sh in st.shards}
            found = [by_name.get(Path(u).name) if _same_folder(_base(u), base) else None for u in urls]
            if None in found or len({sp for sp, _ in found}) != 1:
                raise DataError(f"--data {shown}: the shards are not one split of {quoted(base)}/{MANIFEST}")
            split = found[0][0]
            sets[split] = ShardSet(tuple(Shard(u, sh.samples, sh.sha256) for u, (_, sh) in zip(urls, found)))
        train = sets.get(split, ShardSet())
        val_name = next((n for n in sets if n != split and n in _EVAL_NAMES), None)
        val_name = val_name or next((n for n in sets if n != split), None)
    else:
        if _is_url(urls[0]):
            raise DataError(f"--data {shown}: no {MANIFEST} beside the shards; the reader needs sample counts")
        scanned = [_scan(u) for u in urls]
        labels = set().union(*(lb for _, lb in scanned))
        classes = [str(i) for i in range(max(labels) + 1)]  # max < MAX_CLASSES (_scan)
        train = ShardSet(tuple(Shard(u, n) for u, (n, _) in zip(urls, scanned)))
        split, val_name, sets = "train", None, {}
    if eval_only and urls is not None:
        return ShardSource(name, classes, ShardSet(), train, split)
    if val_name is not None and val_split is None:
        return ShardSource(name, classes, train, sets[val_name], val_name)
    train, val = _hold_out(train, val_split, name=shown)
    return ShardSource(name, classes, train, val, "val")
