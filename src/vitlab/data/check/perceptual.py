"""Perceptual fingerprints of photos and the search for pairs of near copies among them (numpy and PIL, no torch).

A picture saved again (another JPEG quality, resized, slightly cropped) has other bytes but nearly the same low
frequencies. Each picture gets, from its decoded pixels (:func:`fingerprint`):

- the DCT hash (pHash, Zauner 2010; the ``phash`` of the ``imagehash`` library): the greyscale picture shrunk to
  32x32 by area averaging, its 2-D DCT-II, and the 8x8 lowest frequencies compared with their median: 64 bits;
- the same of its centre (:data:`CENTRE` of each side): a copy cropped by ``c`` per side is the original at scale
  ``1 - 2c``, so its whole hash is close to the original's centre hash;
- the DCT hash of its left-right mirror image: training flips pictures (the paper's Inception crop and flip), so a
  mirrored copy of a training picture in the evaluation split is one the model has seen;
- a 16x16 RGB thumbnail of the whole and of the centre, to confirm a pair (below; compared by luma where either
  picture is greyscale, so a greyscale copy of a colour photo is a copy).

Photos of one kind (garments on a bed, products on white) share their low frequencies: on the clothing photos of
``/work/shared/data/clothing`` distinct photos come within 8 bits, as close as a cropped copy. So a pair is a
candidate when its hashes (whole-whole, whole-centre, centre-whole or whole-mirror) are within :data:`NEAR_BITS`,
and a near copy only when its thumbnails (the best of the same four alignments) also correlate at least
:data:`MIN_CORRELATION` (Pearson's r over the 768 RGB values): a copy keeps the colours and their layout to within
the JPEG noise, a look-alike does not.

The candidate search compares every pair, vectorised: blocks of rows XORed against all later rows and their bits
counted (``numpy.bitwise_count``), never a Python loop over pairs; 10,000 pictures are 50 M comparisons per
alignment, about 150 numpy blocks. (An index of hash bands, by the pigeonhole principle, prunes only for thresholds
of a few bits; at :data:`NEAR_BITS` its bands would be 5 bits, too short to prune.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "CENTRE",
    "MIN_CORRELATION",
    "NEAR_BITS",
    "SURE_CORRELATION",
    "THUMB_SIDE",
    "Fingerprint",
    "correlations",
    "fingerprint",
    "hamming",
    "hash_pairs",
    "near_pairs",
    "phash",
]

HASH_SIDE = 32
"""The side of the greyscale square a picture is shrunk to before its DCT."""
THUMB_SIDE = 16
"""The side of the RGB thumbnails a candidate pair is confirmed on."""
CENTRE = 0.92
"""The centre region of the second hash and thumbnail, as a fraction of each side: a crop of 2-5% per side (scale
0.90-0.96) is then within 4% of it in scale, which both tolerate."""
NEAR_BITS = 12
"""A pair whose hashes (whole-whole, whole-centre, centre-whole or whole-mirror) differ in at most this many of 64
bits is a candidate near copy. On a sample of the clothing photos, copies re-encoded (JPEG quality 60-90) differ in
at most 2 bits, resized (0.5-0.9x) in 6, cropped (2-5% per side) in 10 (docs/data_check.md)."""
MIN_CORRELATION = 0.95
"""A candidate is a near copy when its thumbnails (the best of the four alignments) correlate at least this much. On
that sample, copies correlate 0.99 or more re-encoded or resized and 0.97 or more (95th percentile) cropped, and no
two distinct photos within :data:`NEAR_BITS` correlated above 0.93 (docs/data_check.md, benchmarks/bench_data_check.py
for the measured rates)."""
SURE_CORRELATION = 0.99
"""A near copy whose thumbnails correlate at least this much is a *sure* copy: where re-encoded and resized copies
lie (on the clothing photos: all re-encoded copies and 98% of the resized pass it, 59% of the cropped), and no two
distinct photos of the clothing set do (its one pair there is a real copy, docs/data_check.md). Between
:data:`MIN_CORRELATION` and this lie the cropped copies and the look-alikes of photos that share one background and
one framing (distinct garments on one bed cover), which the check reports without being sure of them;
``--strict-data`` stops only on sure copies."""
_BITS = 8  # the 8x8 lowest frequencies
_BLOCK_ELEMENTS = 1 << 22  # pairs compared per numpy block (32 MiB of uint64 XORs)
_LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R 601-2, PIL's convert("L")
_FLAT = 2.0  # a thumbnail whose values vary less than this (standard deviation, levels) is flat
_GREY = 3  # a thumbnail whose channels differ by at most this many levels at every value is greyscale: a greyscale
# picture decodes to equal channels (0 levels); of the 3,781 clothing photos none comes within 6 (the least: 7 levels)


def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix of size ``n``: ``D @ x`` is the DCT of ``x``."""
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    m[0] /= np.sqrt(2.0)
    return m


_DCT = _dct_matrix(HASH_SIDE)[:_BITS]  # only the rows of the low frequencies are needed
_WEIGHTS = (1 << np.arange(63, -1, -1, dtype=np.uint64)).astype(np.uint64)


def phash(grey: np.ndarray) -> int:
    """The 64-bit DCT hash of a ``(32, 32)`` greyscale array (any real dtype): bit ``i`` (most significant first,
    row-major over the 8x8 lowest frequencies) is set where that coefficient is above their median."""
    g = np.asarray(grey, dtype=np.float64)
    if g.shape != (HASH_SIDE, HASH_SIDE):
        raise ValueError(f"phash of a {g.shape} array: expected ({HASH_SIDE}, {HASH_SIDE})")
    low = (_DCT @ g @ _DCT.T).ravel()
    bits = (low > np.median(low)).astype(np.uint64)
    return int((bits * _WEIGHTS).sum(dtype=np.uint64))


@dataclass(frozen=True)
class Fingerprint:
    """What a picture is compared by: ``whole`` and ``centre`` DCT hashes, ``thumbs`` ``(2, 16, 16, 3)`` uint8, the
    whole picture's and its centre's RGB thumbnails, and ``mirror``, the DCT hash of the whole picture mirrored left
    to right (the mirrored thumbnail is ``thumbs[0, :, ::-1]``)."""

    whole: int
    centre: int
    thumbs: np.ndarray
    mirror: int


def fingerprint(rgb: np.ndarray) -> Fingerprint:
    """The :class:`Fingerprint` of a decoded picture, ``(H, W, 3)`` or ``(H, W, 1)`` uint8 (any size: a JPEG decoded
    at a reduced DCT scale is fine, the fingerprint only sees 32x32)."""
    from PIL import Image

    a = np.asarray(rgb, dtype=np.uint8)
    if a.ndim == 3 and a.shape[2] == 1:
        a = np.repeat(a, 3, axis=2)
    im = Image.fromarray(np.ascontiguousarray(a), "RGB")
    w, h = im.size
    mx, my = w * (1 - CENTRE) / 2, h * (1 - CENTRE) / 2
    small = np.stack(
        [
            np.asarray(im.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BOX, box=box), dtype=np.float64)
            for box in ((0, 0, w, h), (mx, my, w - mx, h - my))
        ]
    )  # (2, 32, 32, 3), area averages
    grey = small @ _LUMA
    k = HASH_SIDE // THUMB_SIDE
    thumbs = small.reshape(2, THUMB_SIDE, k, THUMB_SIDE, k, 3).mean(axis=(2, 4))
    thumbs = np.clip(np.round(thumbs), 0, 255).astype(np.uint8)
    return Fingerprint(phash(grey[0]), phash(grey[1]), thumbs, phash(grey[0][:, ::-1]))


def hamming(a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
    """The number of bits in which 64-bit hashes ``a`` and ``b`` differ (broadcast)."""
    x = np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))
    return np.bitwise_count(x).astype(np.int64)


def hash_pairs(
    whole: np.ndarray, centre: np.ndarray | None = None, mirror: np.ndarray | None = None, *, bits: int = NEAR_BITS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair ``i < j`` whose hashes are within ``bits``: ``(i, j, distance)`` arrays, the distance the smallest
    of whole-whole, whole_i-centre_j, centre_i-whole_j and whole_i-mirror_j (each without its array: left out).

    Vectorised in blocks of rows (each block against every later row), so memory stays bounded
    (:data:`_BLOCK_ELEMENTS` pairs at a time) and no Python loop runs over pairs."""
    w = np.asarray(whole, dtype=np.uint64)
    c = None if centre is None else np.asarray(centre, dtype=np.uint64)
    m = None if mirror is None else np.asarray(mirror, dtype=np.uint64)
    n = len(w)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    rows = max(1, _BLOCK_ELEMENTS // max(1, n))
    for start in range(0, max(0, n - 1), rows):
        stop = min(n - 1, start + rows)
        cols = np.arange(start + 1, n)  # every later picture (and, within the block, some earlier: dropped)
        d = np.bitwise_count(w[start:stop, None] ^ w[None, cols])  # uint8 counts: a quarter of int64's memory
        if c is not None:
            np.minimum(d, np.bitwise_count(w[start:stop, None] ^ c[None, cols]), out=d)
            np.minimum(d, np.bitwise_count(c[start:stop, None] ^ w[None, cols]), out=d)
        if m is not None:
            np.minimum(d, np.bitwise_count(w[start:stop, None] ^ m[None, cols]), out=d)
        r, k = np.nonzero(d <= bits)
        i, j = r + start, cols[k]
        keep = j > i
        found.append((i[keep], j[keep], d[r[keep], k[keep]].astype(np.int64)))
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    i, j, d = (np.concatenate(x).astype(np.int64) for x in zip(*found))
    return i, j, d


_ALIGN = ((0, 0), (0, 1), (1, 0), (0, 2))  # (thumbnail of i, of j): whole-whole, -centre, centre-whole, whole-mirror


def correlations(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Pearson's r between the thumbnails of pictures ``i`` and ``j`` (``thumbs`` ``(N, 2, 16, 16, 3)``), the
    largest of the four alignments (whole-whole, whole-centre, centre-whole, whole and the mirrored whole): over the
    768 RGB values, or over the 256 luma values when either thumbnail is greyscale (:data:`_GREY`), so a greyscale
    copy of a colour photo is a copy (its luma is the photo's; its RGB values are not). Two flat thumbnails (blank
    pictures) count 1 when their mean levels are within 4 of each other, else 0; a flat one against one that is not
    counts 0. Only the thumbnails of the pairs are made floats (not all N: 100,000 pictures' are 1.2 GB as
    float64)."""
    t = np.asarray(thumbs)

    def side(idx: np.ndarray, k: int) -> np.ndarray:  # k 2: the whole thumbnail, mirrored left to right
        rows = t[idx, 0, :, ::-1] if k == 2 else t[idx, k]
        return rows.reshape(len(idx), -1, 3).astype(np.float64)

    best = np.full(len(i), -1.0)
    for sa_side, sb_side in _ALIGN:
        a, b = side(i, sa_side), side(j, sb_side)
        r = _pearson(a.reshape(len(i), -1), b.reshape(len(i), -1))
        grey = _is_grey(a) | _is_grey(b)
        if grey.any():  # (the luma only of the pairs that need it: most folders hold no greyscale picture)
            r[grey] = _pearson(a[grey] @ _LUMA, b[grey] @ _LUMA)
        best = np.maximum(best, r)
    return best


def _is_grey(rgb: np.ndarray) -> np.ndarray:
    """Which thumbnails ``(n, 256, 3)`` are greyscale: every value's channels within :data:`_GREY` levels."""
    return (rgb.max(axis=2) - rgb.min(axis=2)).max(axis=1) <= _GREY


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of ``a`` with the same row of ``b`` (``(n, m)`` floats), with the flat rule of
    :func:`correlations`."""
    ma, mb = a.mean(axis=1), b.mean(axis=1)
    a, b = a - ma[:, None], b - mb[:, None]
    sa, sb = np.sqrt((a * a).mean(axis=1)), np.sqrt((b * b).mean(axis=1))
    r = (a * b).mean(axis=1) / np.maximum(sa * sb, 1e-12)
    flat_a, flat_b = sa < _FLAT, sb < _FLAT
    same_level = (np.abs(ma - mb) <= 4).astype(np.float64)
    return np.where(flat_a & flat_b, same_level, np.where(flat_a | flat_b, 0.0, r))


def near_pairs(
    whole: np.ndarray,
    centre: np.ndarray,
    thumbs: np.ndarray,
    mirror: np.ndarray,
    *,
    bits: int = NEAR_BITS,
    min_correlation: float = MIN_CORRELATION,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The near copies among pictures with these fingerprints (arrays of :class:`Fingerprint` fields):
    ``(i, j, distance, correlation)`` of every pair ``i < j`` within ``bits`` (:func:`hash_pairs`) whose
    thumbnails correlate at least ``min_correlation`` (:func:`correlations`)."""
    i, j, d = hash_pairs(whole, centre, mirror, bits=bits)
    r = correlations(thumbs, i, j) if len(i) else np.zeros(0)
    keep = r >= min_correlation
    return i[keep], j[keep], d[keep], r[keep]
