"""Whether a decode cache on disk is what its metadata says: the metadata's fields (version, key,
layout, dtype, counts, the kept and skipped files, the image sizes, one CRC-32 per chunk) and then the
pixels, chunk by chunk. :func:`vitlab.data.cache.store.decode_files` deletes and rebuilds a cache that fails
either check.
Two layouts share one format: images of one size (``shape`` ``[N, H, W, C]``, read as an ``(N, H, W, C)``
memmap) and images of several sizes (``shape`` ``[N, 0, 0, C]`` with ``heights`` and ``widths``, read as
:class:`~vitlab.data.images.rows.PackedImages`). Either way the file holds the images back to back, and chunk
``j`` is images ``chunk_ends[j - 1]:chunk_ends[j]``."""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["byte_offsets", "content_problem", "metadata_problem"]


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _ints(v: Any, n: int, low: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(_is_int(x, low) for x in v)


def metadata_problem(meta: Any, *, version: int, key: str, count: int, chans: int) -> str | None:
    """Why ``meta`` does not describe a complete cache of ``count`` files with ``chans`` channels, or ``None``."""
    if not isinstance(meta, dict):
        return "the metadata is not a JSON object"
    if meta.get("version") != version or meta.get("key") != key:
        return f"the metadata is of version {meta.get('version')!r}, key {meta.get('key')!r}, not {version}, {key}"
    shape, kept, skipped, ends, crcs = (meta.get(k) for k in ("shape", "kept", "skipped", "chunk_ends", "crc32"))
    packed = "heights" in meta or "widths" in meta
    if meta.get("dtype") != "uint8" or not (
        isinstance(shape, list)
        and len(shape) == 4
        and all(_is_int(s) for s in shape)
        and shape[3] > 0
        and ((shape[1] == shape[2] == 0) if packed else min(shape[1:]) > 0)
    ):
        return f"the metadata's dtype {meta.get('dtype')!r} and shape {shape!r} are not uint8 (N, H, W, C)"
    if shape[3] != chans or meta.get("count") != count:
        return f"the metadata is for {meta.get('count')!r} files of {shape[3]} channels, not {count} of {chans}"
    if packed and not (_ints(meta.get("heights"), shape[0], 1) and _ints(meta.get("widths"), shape[0], 1)):
        return f"the metadata's image sizes do not match its {shape[0]} images"
    if not (isinstance(kept, list) and len(kept) == shape[0] and all(_is_int(i) for i in kept)) or any(
        b <= a for a, b in itertools.pairwise(kept)
    ):
        return f"the metadata's list of kept files does not match its {shape[0]} images"
    if (kept and kept[-1] >= count) or not isinstance(skipped, list) or len(kept) + len(skipped) != count:
        return f"the metadata's kept and skipped files do not add up to {count}"
    if not all(isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s) for s in skipped):
        return "the metadata's list of skipped files is malformed"
    if not (
        isinstance(ends, list)
        and all(_is_int(e, 1) for e in ends)
        and all(b > a for a, b in itertools.pairwise(ends))
        and (ends[-1] == shape[0] if ends else shape[0] == 0)
        and isinstance(crcs, list)
        and len(crcs) == len(ends)
    ):
        return "the metadata's checksums do not cover its images"
    if not all(_is_int(c) for c in crcs):
        return "the metadata's checksums are not numbers"
    if not (_is_int(meta.get("max_bytes")) and isinstance(meta.get("over_budget"), bool)):
        return "the metadata's memory budget is missing"
    return None


def byte_offsets(meta: dict[str, Any]) -> np.ndarray:
    """Where each image of a cache whose ``meta`` passed :func:`metadata_problem` starts in the file, and
    where the last ends: ``N + 1`` int64 offsets."""
    n, h, w, c = meta["shape"]
    if "heights" in meta:
        sizes = np.asarray(meta["heights"], dtype=np.int64) * np.asarray(meta["widths"], dtype=np.int64) * c
    else:
        sizes = np.full(n, h * w * c, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def content_problem(
    data_f: Path, *, offsets: np.ndarray, chunk_ends: list[int], crcs: list[int], buffer_bytes: int
) -> str | None:
    """The first chunk of ``data_f`` whose CRC-32 differs from ``crcs``, or ``None``: one sequential read,
    in pieces of at most half of ``buffer_bytes`` (the memory budget) and at most one chunk."""
    largest = max((int(offsets[e] - offsets[s]) for s, e in zip([0, *chunk_ends], chunk_ends)), default=1)
    view = memoryview(bytearray(max(1, min(largest, buffer_bytes // 2))))
    with open(data_f, "rb", buffering=0) as f:
        for j, (start, end) in enumerate(zip([0, *chunk_ends], chunk_ends)):
            step = int(offsets[end] - offsets[start])
            n, crc = 0, 0
            while n < step:
                got = f.readinto(view[: step - n])
                if not got:
                    break
                crc = zlib.crc32(view[:got], crc)
                n += got
            if n == 0 or crc != crcs[j]:
                last = start if n == 0 else int(np.searchsorted(offsets, offsets[start] + n, side="left")) - 1
                last = min(max(start, last), end - 1)
                return f"images {start}-{last} do not match their checksum (the file is damaged)"
    return None
