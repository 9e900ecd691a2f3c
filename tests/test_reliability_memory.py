"""Memory: the decode cache is built and read within a budget smaller than the dataset.

Measured with tracemalloc (NumPy registers its buffers there), not wall-clock: the
decoded images must go to the memory-mapped file in bounded windows, and reading them
back must go through the memmap page by page.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
from PIL import Image

from vitlab.data import ArrayDataset, load_data
from vitlab.data.cache import decode_files

N, SIDE = 240, 64  # 240 x 64 x 64 x 3 = 2.9 MB decoded
DATASET_BYTES = N * SIDE * SIDE * 3
BUDGET = 1 << 20  # 1 MiB: about a third of the dataset


def _files(root):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(N):
        d = root / "train" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8)).save(p, compress_level=0)
        paths.append(str(p))
    return paths


def _peak(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_cache_larger_than_the_budget_is_built_and_read_in_bounded_memory(tmp_path):
    paths = _files(tmp_path / "data")
    assert DATASET_BYTES > 2.5 * BUDGET
    dec, peak_build = _peak(
        lambda: decode_files(paths, cache_dir=tmp_path / "cache", name="big", workers=2, progress=False, buffer_bytes=BUDGET // 4)
    )
    assert isinstance(dec.images, np.memmap) and dec.images.shape == (N, SIDE, SIDE, 3)
    assert peak_build < BUDGET, f"building the cache peaked at {peak_build:,} bytes of Python/NumPy memory"

    ds = ArrayDataset(dec.images, np.zeros(N, np.int64))

    def read_all():
        total = 0
        for i in range(len(ds)):
            total += int(ds[i][0][:, 0, 0].sum())
        return total

    total, peak_read = _peak(read_all)
    assert peak_read < BUDGET // 4, f"reading peaked at {peak_read:,} bytes"
    # the values read back are the files' pixels, not zeros of an unwritten map
    assert total == sum(int(np.asarray(Image.open(p))[0, 0].sum()) for p in paths)


def test_load_data_keeps_the_training_split_memory_mapped(tmp_path):
    _files(tmp_path / "data")
    val = tmp_path / "data" / "val"
    for c in ("c0", "c1"):
        (val / c).mkdir(parents=True)
        Image.new("RGB", (SIDE, SIDE), (9, 9, 9)).save(val / c / "0.png")
    splits = load_data(str(tmp_path / "data"), cache_dir=tmp_path / "cache", progress=False)
    assert isinstance(splits.train.images, np.memmap) and len(splits.train) == N  # read from disk on demand
    assert str(splits.train.images.filename).endswith(".u8")
