"""Which tar shards a ``--data`` value names, how many samples each holds, and how to read them.

Three spellings name shards (the format ``vitlab data pack`` writes, :mod:`vitlab.data.shards`, which is
WebDataset's: ``<key>.<ext>`` + ``<key>.cls`` members):

- a folder with ``manifest.json``: its ``train`` split and its evaluation split (``val``, ``test`` ...);
- a brace pattern or list, ``shards/train-{000000..000123}.tar`` (``::`` joins several), expanded by
  ``webdataset`` as its own readers expand it; also URLs it opens (``https://``, ``pipe:``, ``gs://`` ...).
  The ``manifest.json`` beside the first shard gives the sample counts and class names; local shards
  without one are counted by reading their tar headers once (classes are then named by their index);
- the evaluation split is the manifest's other split, else the last shards held out (``--val-split``).

The reader needs every shard's sample count before it starts (the epoch's order is arithmetic over the
counts, :mod:`vitlab.data.stream`). Local shards are opened seekable, so the members a process does not
need are skipped without being read; URLs are streamed (``webdataset.gopen``), read through to the end.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from .decode import IMAGE_EXTENSIONS
from .shards import MANIFEST, PackError, read_manifest

__all__ = ["Shard", "ShardSet", "ShardSource", "is_shard_spec", "iter_samples", "open_shard", "open_source"]

_URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
_KEY = re.compile(r"^((?:.*/|)[^/.]+)\.([^/]*)$")  # webdataset's split: the key ends at the basename's first dot
_SAFE_NAME = re.compile(r"^[\w.-]+\.tar$")
_EVAL_NAMES = ("val", "valid", "validation", "test")
_IMAGE_EXTS = {e.lstrip(".") for e in IMAGE_EXTENSIONS} | {"img"}


def _is_url(s: str) -> bool:
    return bool(_URL.match(s)) and not re.match(r"^[a-z]:[\\/]", s, re.IGNORECASE)  # not a Windows drive


def is_shard_spec(spec: str) -> bool:
    """Whether ``--data spec`` names tar shards: a folder holding ``manifest.json``, a ``.tar`` path or
    pattern (``{a..b}`` braces, ``::`` lists), or a URL (``hf:NAME``, a Hugging Face data set, is not one)."""
    s = spec.strip()
    if s.lower().startswith("hf:") and not s.startswith("hf://"):  # a Hugging Face data set name: not built
        return False
    if _is_url(s) or (".tar" in s and ("{" in s or "::" in s or s.endswith(".tar"))):
        return True
    p = Path(s).expanduser()
    return p.is_dir() and (p / MANIFEST).is_file()


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
        """What ``--resume`` compares (the shape of :func:`vitlab.train.loaders.data_fingerprint`): per split,
        its samples and a digest of its shards' names, counts and checksums."""

        def key(s: ShardSet) -> str:
            rows = [[Path(sh.url).name, sh.samples, sh.sha256] for sh in s.shards]
            return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]

        splits = {"train": self.train, self.val_name: self.val}
        return {"classes": self.classes, "splits": {n: {"files": len(s), "key": key(s)} for n, s in splits.items()}}


def open_shard(url: str) -> tarfile.TarFile:
    """A shard opened for reading: a local file seekable (members not read are skipped by a seek), a URL
    as a stream through ``webdataset.gopen``."""
    if not _is_url(url) or url.startswith("file:"):
        return tarfile.open(url.removeprefix("file:"), "r:")
    return tarfile.open(fileobj=_gopen(url), mode="r|")


def iter_samples(
    tar: tarfile.TarFile, want: Callable[[int], bool], *, exts: set[str] | None = None
) -> Iterator[tuple[int, str, dict[str, bytes] | None]]:
    """``(index, key, members)`` of each sample of an open shard, in order: consecutive members sharing a key
    (WebDataset's grouping). ``members`` (extension -> bytes; only ``exts`` when given) is read for the samples
    ``want(index)`` asks for, None for the others, which are never read. ``want`` is asked as a sample's first
    member is reached, so it must answer for any index at any time."""
    index, key, parts = -1, None, None
    for m in tar:
        tar.members = []  # no growing list of every member seen
        match = _KEY.match(m.name)
        if not m.isfile() or match is None or Path(m.name).name.startswith("__"):
            continue
        k, ext = match.groups()
        if k != key:
            if key is not None:
                yield index, key, parts
            index, key = index + 1, k
            parts = {} if want(index) else None
        if parts is not None and (exts is None or ext.lower() in exts):
            f = tar.extractfile(m)
            parts[ext.lower()] = f.read() if f is not None else b""
    if key is not None:
        yield index, key, parts


def image_and_label(parts: dict[str, bytes], *, where: str) -> tuple[bytes, int]:
    """A sample's encoded image and class index; a :class:`DataError` naming ``where`` when one is missing."""
    image = next((v for e, v in parts.items() if e in _IMAGE_EXTS), None)
    if image is None or "cls" not in parts:
        raise DataError(
            f"{where}: no {'image' if image is None else '.cls'} member (a sample is <key>.jpg + <key>.cls)"
        )
    try:
        return image, int(parts["cls"].strip())
    except ValueError:
        raise DataError(f"{where}: the .cls member is not an integer class index") from None


def _gopen(url: str):
    try:
        from webdataset import gopen
    except ImportError:
        raise DataError(f"{url}: reading shards from URLs needs webdataset: pip install 'vitlab[stream]'") from None
    try:
        return gopen(url)
    except Exception as e:
        raise DataError(f"{url}: cannot open ({type(e).__name__}: {e})") from None


def _expand(spec: str) -> list[str]:
    try:
        from webdataset.shardlists import expand_urls
    except ImportError:
        raise DataError(f"--data {spec}: shard patterns need webdataset: pip install 'vitlab[stream]'") from None
    return [u.strip() for u in expand_urls(spec.strip()) if u.strip()]


def _base(url: str) -> str:
    return url.rsplit("/", 1)[0] if "/" in url else "."


def _join(base: str, name: str) -> str:
    return str(Path(base) / name) if not _is_url(base) else f"{base}/{name}"


def _manifest_at(base: str) -> dict | None:
    """The manifest of the folder or URL ``base`` (checked as :func:`read_manifest` checks one), or None."""
    if not _is_url(base):
        return read_manifest(base) if (Path(base) / MANIFEST).is_file() else None
    try:
        with _gopen(_join(base, MANIFEST)) as f:
            m = json.loads(f.read())
    except Exception:
        return None
    return m if isinstance(m, dict) and "splits" in m else None


def _split_sets(m: dict, base: str) -> dict[str, ShardSet]:
    sets = {}
    for split, s in m["splits"].items():
        for sh in s["shards"]:
            if not _SAFE_NAME.match(str(sh["name"])):
                raise PackError(f"{base}/{MANIFEST}: shard name {sh['name']!r} is not a plain file name")
        shards = (Shard(_join(base, sh["name"]), int(sh["samples"]), sh["sha256"]) for sh in s["shards"])
        sets[split] = ShardSet(tuple(shards))
    return sets


def _scan(url: str) -> tuple[int, set[int]]:
    """``(samples, class indices)`` of a local shard, from its headers and ``.cls`` members."""
    labels, n = set(), 0
    with open_shard(url) as tar:
        for i, key, parts in iter_samples(tar, lambda i: True, exts={"cls"}):
            if "cls" not in parts:
                raise DataError(f"{url}: sample {key} has no .cls member")
            labels.add(int(parts["cls"].strip()))
            n = i + 1
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


def open_source(spec: str, *, val_split: float | None = None, eval_only: bool = False) -> ShardSource:
    """Resolve ``--data spec`` (:func:`is_shard_spec`) to its shards. ``eval_only`` (``vitlab eval``): a pattern's
    shards are the evaluation split themselves; a folder's evaluation split is its own."""
    s = spec.strip()
    folder = Path(s).expanduser()
    if not _is_url(s) and folder.is_dir():
        m, base, urls = read_manifest(folder), str(folder), None
    else:
        urls = _expand(s)
        base = _base(urls[0])
        m = _manifest_at(base)
        if not _is_url(urls[0]):
            missing = [u for u in urls if not Path(u).is_file()]
            if missing:
                raise DataError(f"--data {spec}: {len(missing)} shard(s) missing, e.g. {missing[0]}")
    name = Path(base).name if not _is_url(base) else base.rsplit("/", 1)[-1]
    if m is not None:
        sets = _split_sets(m, base)
        classes = [str(c) for c in m["classes"]]
        if urls is None:
            split = "train"
        else:
            by_name = {Path(sh.url).name: (sp, sh) for sp, st in sets.items() for sh in st.shards}
            found = [by_name.get(Path(u).name) for u in urls]
            if None in found or len({sp for sp, _ in found}) != 1:
                raise DataError(f"--data {spec}: the shards are not one split of {base}/{MANIFEST}")
            split = found[0][0]
            sets[split] = ShardSet(tuple(Shard(u, sh.samples, sh.sha256) for u, (_, sh) in zip(urls, found)))
        train = sets.get(split, ShardSet())
        val_name = next((n for n in sets if n != split and n in _EVAL_NAMES), None)
        val_name = val_name or next((n for n in sets if n != split), None)
    else:
        if _is_url(urls[0]):
            raise DataError(f"--data {spec}: no {MANIFEST} beside the shards ({base}); the reader needs sample counts")
        scanned = [_scan(u) for u in urls]
        labels = set().union(*(lb for _, lb in scanned))
        classes = [str(i) for i in range(max(labels) + 1)] if labels else []
        train = ShardSet(tuple(Shard(u, n) for u, (n, _) in zip(urls, scanned)))
        split, val_name, sets = "train", None, {}
    if eval_only and urls is not None:
        return ShardSource(name, classes, ShardSet(), train, split)
    if val_name is not None and val_split is None:
        return ShardSource(name, classes, train, sets[val_name], val_name)
    train, val = _hold_out(train, val_split, name=spec)
    return ShardSource(name, classes, train, val, "val")
