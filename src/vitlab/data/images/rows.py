"""Rows of an image array, selected without copying them, and images of different sizes in one flat array.

NumPy's fancy indexing (``images[idx]``) copies the selected rows into memory. On a
memory-mapped decode cache that turns a held-out split, or one process's evaluation shard,
into a full in-RAM copy, which defeats the memmap for a dataset larger than RAM.
:class:`ImageRows` keeps the base array and the row numbers instead, and reads rows only
when they are indexed, so the OS pages the memmap in and out as usual.

A folder of photos keeps each photo's aspect ratio in the decode cache, so its images differ in size:
:class:`PackedImages` holds them back to back in one flat ``uint8`` array (a memmap) with each image's
offset, height and width, and reads one image as an ``(H, W, C)`` view.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ImageRows", "PackedImages"]


class ImageRows:
    """Rows ``index`` of a base ``(N, H, W, C)`` array (a memmap is fine), not copied.

    Indexing reads from the base: an int gives one ``(H, W, C)`` image, a slice or an integer
    (or boolean) array gives a NumPy array of just those rows, as ``base[index][key]`` would but
    without materialising ``base[index]``. A view of a view composes the two indices, so the
    base is always a plain array and a row read is one lookup. ``np.asarray(view)`` materialises
    every selected row (a copy the size of the view): avoid it on large data.
    """

    __slots__ = ("base", "index")

    base: np.ndarray | PackedImages
    index: npt.NDArray[np.int64]

    def __init__(self, base: np.ndarray | PackedImages | ImageRows, index: npt.ArrayLike) -> None:
        idx = np.asarray(index)
        if idx.dtype == bool:
            if idx.shape != (len(base),):
                raise IndexError(
                    f"ImageRows: a boolean index needs one value per row ({len(base)}), got shape {idx.shape}"
                )
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
            raise TypeError(
                f"ImageRows: index must be a 1-D integer or boolean array, got {idx.dtype} of shape {idx.shape}"
            )
        idx = idx.astype(np.int64, copy=False)
        if isinstance(base, ImageRows):  # compose instead of chaining views
            self.base, self.index = base.base, base.index[idx]
            return
        n = len(base)
        if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"ImageRows: row index out of range for {n} rows")
        self.base, self.index = base, np.where(idx < 0, idx + n, idx)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.index), *self.base.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.base.dtype

    @property
    def ndim(self) -> int:
        return self.base.ndim

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: int | np.integer | slice | npt.ArrayLike) -> np.ndarray:
        if isinstance(key, tuple):
            raise TypeError("ImageRows: index the rows first (view[rows]), then the returned array")
        rows = self.index[key]  # NumPy's own semantics and errors for the row key
        if np.ndim(rows) == 0:
            return self.base[int(rows)]
        got = self.base[rows]
        return got if isinstance(got, list) else np.asarray(got)  # images of several sizes: a list

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """Every selected row in one new array (``np.asarray(view)``): the size of the view in memory."""
        if copy is False:
            raise ValueError("ImageRows: the selected rows cannot be an array without a copy")
        out = np.asarray(self.base[self.index])
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"ImageRows({len(self.index)} of {len(self.base)} rows, shape={self.shape}, dtype={self.dtype})"


class PackedImages:
    """Images of different sizes, stored back to back in one flat ``uint8`` array ``data`` (a memmap is
    fine): image ``i`` is ``data[offsets[i]:offsets[i + 1]]`` seen as ``(heights[i], widths[i], chans)``.

    An int gives that image as a view (nothing copied; a memmap reads its pages); a slice or an integer
    array gives a list of views. ``shape`` is ``(N, None, None, chans)``: the height and width vary.
    The offsets, heights and widths are per-image bookkeeping (8 + 2 x 8 bytes an image)."""

    __slots__ = ("chans", "data", "heights", "offsets", "widths")

    def __init__(self, data: np.ndarray, *, heights: npt.ArrayLike, widths: npt.ArrayLike, chans: int) -> None:
        self.heights = np.asarray(heights, dtype=np.int64)
        self.widths = np.asarray(widths, dtype=np.int64)
        if self.heights.shape != self.widths.shape or self.heights.ndim != 1:
            raise ValueError("PackedImages: heights and widths must be 1-D and of one length")
        self.chans = int(chans)
        self.offsets = np.concatenate([[0], np.cumsum(self.heights * self.widths * self.chans)]).astype(np.int64)
        if data.ndim != 1 or len(data) != int(self.offsets[-1]):
            raise ValueError(f"PackedImages: {len(data):,} bytes of data for images of {int(self.offsets[-1]):,}")
        self.data = data

    @property
    def shape(self) -> tuple[int | None, ...]:
        return (len(self.heights), None, None, self.chans)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return 4

    def __len__(self) -> int:
        return len(self.heights)

    def __getitem__(self, key: int | np.integer | slice | npt.ArrayLike) -> np.ndarray | list[np.ndarray]:
        if isinstance(key, (int, np.integer)):
            i = range(len(self))[int(key)]  # negative indices, and IndexError out of range
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            return self.data[lo:hi].reshape(int(self.heights[i]), int(self.widths[i]), self.chans)
        return [self[int(i)] for i in np.arange(len(self))[key]]

    def __repr__(self) -> str:
        return f"PackedImages({len(self)} images of {self.chans} channel(s), {len(self.data):,} bytes)"
