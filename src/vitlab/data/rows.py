"""Rows of an image array, selected without copying them.

NumPy's fancy indexing (``images[idx]``) copies the selected rows into memory. On a
memory-mapped decode cache that turns a held-out split, or one process's evaluation shard,
into a full in-RAM copy, which defeats the memmap for a dataset larger than RAM.
:class:`ImageRows` keeps the base array and the row numbers instead, and reads rows only
when they are indexed, so the OS pages the memmap in and out as usual.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ImageRows"]


class ImageRows:
    """Rows ``index`` of a base ``(N, H, W, C)`` array (a memmap is fine), not copied.

    Indexing reads from the base: an int gives one ``(H, W, C)`` image, a slice or an integer
    (or boolean) array gives a NumPy array of just those rows, as ``base[index][key]`` would but
    without materialising ``base[index]``. A view of a view composes the two indices, so the
    base is always a plain array and a row read is one lookup. ``np.asarray(view)`` materialises
    every selected row (a copy the size of the view): avoid it on large data.
    """

    __slots__ = ("base", "index")

    base: np.ndarray
    index: npt.NDArray[np.int64]

    def __init__(self, base: np.ndarray | ImageRows, index: npt.ArrayLike) -> None:
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
        return np.asarray(self.base[rows])

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """Every selected row in one new array (``np.asarray(view)``): the size of the view in memory."""
        if copy is False:
            raise ValueError("ImageRows: the selected rows cannot be an array without a copy")
        out = np.asarray(self.base[self.index])
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"ImageRows({len(self.index)} of {len(self.base)} rows, shape={self.shape}, dtype={self.dtype})"
