"""Whether a decode cache on disk is what its metadata says: the metadata's fields (version, key,
shape, dtype, counts, the kept and skipped files, one CRC-32 per chunk) and then the pixels, chunk by
chunk. :func:`vitlab.data.cache.decode_files` deletes and rebuilds a cache that fails either check."""

from __future__ import annotations

import itertools
import math
import zlib
from pathlib import Path
from typing import Any

__all__ = ["content_problem", "metadata_problem"]


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def metadata_problem(meta: Any, *, version: int, key: str, count: int, chans: int) -> str | None:
    """Why ``meta`` does not describe a complete cache of ``count`` files with ``chans`` channels, or ``None``."""
    if not isinstance(meta, dict):
        return "the metadata is not a JSON object"
    if meta.get("version") != version or meta.get("key") != key:
        return f"the metadata is of version {meta.get('version')!r}, key {meta.get('key')!r}, not {version}, {key}"
    shape, kept, skipped, ci, crcs = (meta.get(k) for k in ("shape", "kept", "skipped", "chunk_images", "crc32"))
    if meta.get("dtype") != "uint8" or not (
        isinstance(shape, list) and len(shape) == 4 and all(_is_int(s) for s in shape) and min(shape[1:]) > 0
    ):
        return f"the metadata's dtype {meta.get('dtype')!r} and shape {shape!r} are not uint8 (N, H, W, C)"
    if shape[3] != chans or meta.get("count") != count:
        return f"the metadata is for {meta.get('count')!r} files of {shape[3]} channels, not {count} of {chans}"
    if not (isinstance(kept, list) and len(kept) == shape[0] and all(_is_int(i) for i in kept)) or any(
        b <= a for a, b in itertools.pairwise(kept)
    ):
        return f"the metadata's list of kept files does not match its {shape[0]} images"
    if (kept and kept[-1] >= count) or not isinstance(skipped, list) or len(kept) + len(skipped) != count:
        return f"the metadata's kept and skipped files do not add up to {count}"
    if not all(isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s) for s in skipped):
        return "the metadata's list of skipped files is malformed"
    if not (_is_int(ci, 1) and isinstance(crcs, list) and len(crcs) == math.ceil(shape[0] / ci)):
        return "the metadata's checksums do not cover its images"
    if not all(_is_int(c) for c in crcs):
        return "the metadata's checksums are not numbers"
    return None


def content_problem(
    data_f: Path, *, image_bytes: int, chunk_images: int, crcs: list[int], buffer_bytes: int
) -> str | None:
    """The first chunk of ``data_f`` whose CRC-32 differs from ``crcs``, or ``None``: one sequential read,
    in pieces of at most half of ``buffer_bytes`` (the memory budget) and at most one chunk."""
    step = image_bytes * chunk_images
    view = memoryview(bytearray(max(1, min(step, buffer_bytes // 2))))
    with open(data_f, "rb", buffering=0) as f:
        for j, want in enumerate(crcs):
            n, crc = 0, 0
            while n < step:
                got = f.readinto(view[: step - n])
                if not got:
                    break
                crc = zlib.crc32(view[:got], crc)
                n += got
            if n == 0 or crc != want:
                first = j * chunk_images
                last = first + max(1, n // image_bytes) - 1
                return f"images {first}-{last} do not match their checksum (the file is damaged)"
    return None
