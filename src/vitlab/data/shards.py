"""Pack an ImageFolder into WebDataset-style tar shards with a manifest (``vitlab data pack``).

Each sample is two tar members that share a key, as WebDataset (and timm's ``reader_wds``) expect:
``<key>.<ext>``, the original encoded file byte for byte (nothing is decoded or re-encoded, so a
reader can decode at full resolution and random-crop the original picture), and ``<key>.cls``, the
class index as decimal text. Shards are named ``<split>-000000.tar``; ``manifest.json`` lists the
class names and, per shard, its samples, bytes, per-class counts and SHA-256, so a reader can check
a shard and split shards across ranks and workers by sample count without opening them.

Only the standard library's :mod:`tarfile` is used: the shards are plain POSIX tars that
``webdataset``, ``tar`` and :func:`read_shard` all read. Samples are shuffled (seeded) before packing,
so that a streaming reader's bounded shuffle buffer sees every class from its first shard.
This module writes and checks shards; :mod:`vitlab.data.stream` trains and evaluates from them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import VitlabError

__all__ = ["MANIFEST", "PackError", "pack_folder", "read_manifest", "read_shard"]

MANIFEST = "manifest.json"
FORMAT = "vitlab-wds"
VERSION = 1


class PackError(VitlabError):
    """The source cannot be packed, or a shard folder's manifest or shard is not valid."""


@dataclass(frozen=True)
class _Sample:
    path: str
    label: int


def _splits(root: Path) -> dict[str, Path]:
    """The split folders of ``root`` as :func:`vitlab.data.load_data` finds them: ``train`` and the first
    of ``val``/``valid``/``validation``/``test``, or ``root`` itself as one ``train`` tree."""
    train = root / "train"
    val = next((root / n for n in ("val", "valid", "validation", "test") if (root / n).is_dir()), None)
    if train.is_dir():
        return {"train": train, **({val.name: val} if val is not None else {})}
    return {"train": root}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o444, 0, 0
    tar.addfile(info, io.BytesIO(data))


def pack_folder(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    shard_bytes: int = 1 << 30,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, object]:
    """Write ``src`` (an ImageFolder: ``train/<class>/*`` with ``val/``, or one class tree) as tar shards
    of at most ``shard_bytes`` of files (at least one sample a shard) plus ``manifest.json`` under
    ``out``, and return the manifest. Each shard is written to a temp name and renamed when complete;
    the manifest is written last, so a folder with a manifest is complete."""
    from .._progress import ProgressLog
    from .scan import scan_classes

    root, dest = Path(src).expanduser(), Path(out)
    if not root.is_dir():
        raise PackError(f"{src}: not a folder (vitlab data pack reads an ImageFolder)")
    if (dest / MANIFEST).exists():
        raise PackError(f"{dest}: already holds packed shards ({MANIFEST}); choose another OUT or delete it")
    if shard_bytes < 1:
        raise PackError("--shard-size must be positive")
    dest.mkdir(parents=True, exist_ok=True)
    classes: list[str] | None = None
    seen: dict[tuple[int, int], str] = {}
    manifest: dict[str, object] = {"format": FORMAT, "version": VERSION, "source": str(root.resolve())}
    splits: dict[str, object] = {}
    for split, folder in _splits(root).items():
        paths, labels, names = scan_classes(folder, classes, seen=seen)
        classes = classes or names
        order = np.random.default_rng(seed).permutation(len(paths))
        samples = [_Sample(paths[i], int(labels[i])) for i in order]
        shards: list[dict[str, object]] = []
        with ProgressLog(total=len(samples), desc=f"packing {split}", unit="img", enabled=progress) as bar:
            i = 0
            while i < len(samples):
                name = f"{split}-{len(shards):06d}.tar"
                tmp = dest / f".{name}.tmp{os.getpid()}"
                counts = [0] * len(classes)
                n = size = 0
                with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
                    while i < len(samples) and (n == 0 or size + os.path.getsize(samples[i].path) <= shard_bytes):
                        s = samples[i]
                        data = Path(s.path).read_bytes()
                        key = f"{split}{i:09d}"
                        ext = Path(s.path).suffix.lower().lstrip(".") or "img"
                        _add(tar, f"{key}.{ext}", data)
                        _add(tar, f"{key}.cls", str(s.label).encode())
                        counts[s.label] += 1
                        n, size, i = n + 1, size + len(data), i + 1
                        bar.update(1)
                digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
                os.replace(tmp, dest / name)
                shards.append(
                    {
                        "name": name,
                        "samples": n,
                        "bytes": (dest / name).stat().st_size,
                        "sha256": digest,
                        "class_counts": counts,
                    }
                )
        splits[split] = {"samples": len(samples), "shards": shards}
    manifest.update(classes=classes, splits=splits)
    tmp_m = dest / f".{MANIFEST}.tmp{os.getpid()}"
    tmp_m.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp_m, dest / MANIFEST)
    return manifest


def read_manifest(folder: str | os.PathLike[str], *, verify: bool = False) -> dict[str, object]:
    """The manifest of a folder :func:`pack_folder` wrote, checked: its format, that every shard exists
    with the size it lists and the per-split sample counts add up; with ``verify`` also each shard's SHA-256."""
    d = Path(folder)
    try:
        m = json.loads((d / MANIFEST).read_text())
    except FileNotFoundError:
        raise PackError(f"{d}: no {MANIFEST} (not a folder that vitlab data pack wrote)") from None
    except ValueError as e:
        raise PackError(f"{d / MANIFEST}: does not parse ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION:
        raise PackError(f"{d / MANIFEST}: not a {FORMAT} v{VERSION} manifest")
    for split, s in m["splits"].items():
        if sum(sh["samples"] for sh in s["shards"]) != s["samples"]:
            raise PackError(f"{d / MANIFEST}: the {split} shards do not add up to {s['samples']} samples")
        for sh in s["shards"]:
            p = d / sh["name"]
            if not p.is_file() or p.stat().st_size != sh["bytes"]:
                raise PackError(f"{p}: missing or not the {sh['bytes']:,} bytes the manifest lists")
            if verify and hashlib.sha256(p.read_bytes()).hexdigest() != sh["sha256"]:
                raise PackError(f"{p}: SHA-256 differs from the manifest's (the shard is damaged)")
    return m


def read_shard(path: str | os.PathLike[str]) -> Iterator[tuple[str, bytes, int]]:
    """``(key, encoded image bytes, class index)`` of each sample of one shard, in order."""
    with tarfile.open(path, "r") as tar:
        image: tuple[str, bytes] | None = None
        for member in tar:
            key, _, ext = member.name.rpartition(".")
            f = tar.extractfile(member)
            data = f.read() if f is not None else b""
            if ext == "cls":
                if image is None or image[0] != key:
                    raise PackError(f"{path}: {member.name} without its image")
                yield key, image[1], int(data)
                image = None
            else:
                image = (key, data)
