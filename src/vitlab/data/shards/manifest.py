"""``manifest.json`` of a shard folder (:mod:`vitlab.data.shards.write` writes it): read within a size bound and checked
field by field before anything in it is used.

A manifest is data someone may hand you: every field has one type (whole numbers are JSON integers, never
``2.5``, ``"3"`` or ``true``), every count is in range and adds up, every shard is a plain file name inside the
folder (no ``..``, no ``/``, no URL, no ``pipe:``), split names are the ones ``vitlab data pack`` writes, and the
class list is bounded (:data:`MAX_CLASSES`). Each fault is a one-line :class:`PackError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from ..._fs import NotAFile, TooLarge, read_small
from ...errors import DataError
from .names import quoted

__all__ = [
    "FORMAT",
    "MANIFEST",
    "MAX_CLASSES",
    "MAX_MANIFEST_BYTES",
    "SPLIT_NAMES",
    "VERSION",
    "PackError",
    "check_manifest",
    "parse_manifest",
    "read_manifest",
    "sha256_file",
]

MANIFEST = "manifest.json"
FORMAT = "vitlab-wds"
VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20
"""Largest manifest read (16 MiB: per-shard rows for tens of thousands of shards of a 21k-class data set)."""
MAX_CLASSES = 1_000_000
"""Most classes a shard data set may have (a manifest's list, or the labels found in shards without one)."""
SPLIT_NAMES = ("train", "val", "valid", "validation", "test")
"""The splits a manifest may hold: ``train`` and the evaluation folders :func:`vitlab.data.load_data` knows."""
_SHARD_NAME = re.compile(r"^[\w.-]+\.tar$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class PackError(DataError):
    """The source cannot be packed, or a shard folder's manifest or shard is not valid."""


def _whole(v: Any, lo: int) -> bool:
    return type(v) is int and v >= lo  # bool is not int here; floats (2.0 too) and strings are refused


def check_manifest(m: Any, where: str) -> dict[str, Any]:
    """``m`` (a parsed manifest) checked field by field; returned as is. ``where`` names the file in errors."""

    def fail(field: str, what: str, got: Any = None) -> PackError:
        shown = json.dumps(got)[:60] if not isinstance(got, (dict, list)) else type(got).__name__
        return PackError(f"{where}: {field}: {what}" + (f", not {shown}" if got is not None else ""))

    if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") != VERSION:
        raise PackError(f"{where}: not a {FORMAT} v{VERSION} manifest")
    classes = m.get("classes")
    if not isinstance(classes, list) or not classes:
        raise fail("classes", "expected a list of class names", classes)
    if len(classes) > MAX_CLASSES:
        raise fail("classes", f"{len(classes):,} classes, more than the {MAX_CLASSES:,} vitlab reads")
    bad = next((i for i, c in enumerate(classes) if not isinstance(c, str)), None)
    if bad is not None:
        raise fail(f"classes[{bad}]", "expected a class name (a string)", classes[bad])
    if len(set(classes)) != len(classes):
        raise fail("classes", "a class name is listed twice")
    splits = m.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise fail("splits", "expected an object of splits (train, val ...)", splits)
    names: set[str] = set()
    for split, s in splits.items():
        if split not in SPLIT_NAMES:
            raise fail(f"splits.{quoted(split, 40)}", f"not a split vitlab reads ({', '.join(SPLIT_NAMES)})")
        f = f"splits.{split}"
        if not isinstance(s, dict):
            raise fail(f, "expected an object with samples and shards", s)
        if not _whole(s.get("samples"), 1):
            raise fail(f"{f}.samples", "expected a whole number >= 1", s.get("samples"))
        shards = s.get("shards")
        if not isinstance(shards, list) or not shards:
            raise fail(f"{f}.shards", "expected a list of shards", shards)
        total = 0
        for i, sh in enumerate(shards):
            g = f"{f}.shards[{i}]"
            if not isinstance(sh, dict):
                raise fail(g, "expected an object with name, samples, bytes and sha256", sh)
            name = sh.get("name")
            if not isinstance(name, str) or not _SHARD_NAME.match(name):
                raise fail(f"{g}.name", "expected a plain file name <name>.tar inside the shard folder", name)
            if name in names:
                raise fail(f"{g}.name", f"{name} is listed twice")
            names.add(name)
            for key, lo in (("samples", 1), ("bytes", 0)):
                if not _whole(sh.get(key), lo):
                    raise fail(f"{g}.{key}", f"expected a whole number >= {lo}", sh.get(key))
            if not isinstance(sh.get("sha256"), str) or not _SHA256.match(sh["sha256"]):
                raise fail(f"{g}.sha256", "expected 64 lower-case hex digits", sh.get("sha256"))
            counts = sh.get("class_counts")
            if counts is not None:
                if not isinstance(counts, list) or len(counts) != len(classes) or not all(_whole(c, 0) for c in counts):
                    raise fail(f"{g}.class_counts", f"expected {len(classes)} whole numbers >= 0", counts)
                if sum(counts) != sh["samples"]:
                    raise fail(f"{g}.class_counts", f"add up to {sum(counts):,}, not the shard's {sh['samples']:,}")
            total += sh["samples"]
        if total != s["samples"]:
            raise fail(f"{f}.samples", f"{s['samples']:,}, but its shards add up to {total:,} samples")
    return m


def parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """The manifest in ``raw`` (at most :data:`MAX_MANIFEST_BYTES`), parsed and :func:`check_manifest`-ed."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise PackError(f"{where}: larger than the {MAX_MANIFEST_BYTES >> 20} MiB a manifest may be")
    try:
        m = json.loads(raw)
    except RecursionError:
        raise PackError(f"{where}: does not parse (nested too deeply)") from None
    except ValueError as e:  # JSONDecodeError, bad UTF-8, an integer too long to read
        raise PackError(f"{where}: does not parse ({str(e).splitlines()[0][:120]})") from None
    return check_manifest(m, where)


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file, read in chunks of ``chunk`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_manifest(folder: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """The manifest of a folder :func:`~vitlab.data.shards.write.pack_folder` wrote, checked (:func:`check_manifest`),
    and that every shard it lists is a regular file of the size it lists; with ``verify`` also each shard's
    SHA-256 (read in chunks)."""
    d = Path(folder)
    path = d / MANIFEST
    try:
        raw = read_small(path, limit=MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise PackError(f"{d}: no {MANIFEST} (not a folder that vitlab data pack wrote)") from None
    except NotAFile:
        raise PackError(f"{path}: not a regular file") from None
    except TooLarge:
        raise PackError(f"{path}: larger than the {MAX_MANIFEST_BYTES >> 20} MiB a manifest may be") from None
    except OSError as e:
        raise PackError(f"{path}: cannot read ({e.strerror or e})") from None
    m = parse_manifest(raw, str(path))
    for s in m["splits"].values():
        for sh in s["shards"]:
            p = d / sh["name"]
            try:
                ok = p.stat().st_size == sh["bytes"] and p.is_file()
            except OSError:
                ok = False
            if not ok:
                raise PackError(f"{p}: missing or not the {sh['bytes']:,} bytes the manifest lists")
            if verify and sha256_file(p) != sh["sha256"]:
                raise PackError(f"{p}: SHA-256 differs from the manifest's (the shard is damaged)")
    return m
