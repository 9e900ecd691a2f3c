"""Memory: the decode cache is built and read within a budget smaller than the dataset.

Measured with tracemalloc (NumPy registers its buffers there), not wall-clock: the
decoded images must go to the memory-mapped file in bounded windows, and reading them
back must go through the memmap page by page. A ``--val-split`` split and each process's
evaluation shard are :class:`~vitlab.data.ImageRows` views of the map, never copies.
"""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import vitlab.data.sources
from imagefolder import tiny_folder
from vitlab._units import parse_size
from vitlab.cli import main
from vitlab.data import ArrayDataset, ImageArray, ImageRows, load_data
from vitlab.data.cache.store import decode_files
from vitlab.data.images.scan import scan_classes
from vitlab.data.sources import stratified_split
from vitlab.train import TrainConfig
from vitlab.train.engine.loaders import eval_shard
from vitlab.train.persist.state import load_state

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
        lambda: decode_files(
            paths, cache_dir=tmp_path / "cache", name="big", workers=2, progress=False, buffer_bytes=BUDGET // 4
        )
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


def _digest(img: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(img).tobytes()).hexdigest()


def test_val_split_of_a_tree_larger_than_the_budget_is_two_views_read_in_bounded_memory(tmp_path):
    _files(tmp_path / "data")  # data/train/c0, c1 and no val/: one class tree, split by --val-split
    import sklearn.model_selection  # noqa: F401  (imported before tracing: module objects are not the data)

    def load_and_read_all():
        s = load_data(
            str(tmp_path / "data"), val_split=0.25, cache_dir=tmp_path / "cache", progress=False, buffer_bytes=BUDGET
        )
        seen = {}
        for name, split in (("train", s.train), ("val", s.val)):
            ds = ArrayDataset(split.images, split.labels)  # what training and evaluation read through
            seen[name] = [(_digest(ds[i][0].permute(1, 2, 0).numpy()), ds[i][1]) for i in range(len(ds))]
        return s, seen

    (splits, seen), peak = _peak(load_and_read_all)
    assert DATASET_BYTES > 2.5 * BUDGET
    assert peak < BUDGET, f"load + reading both splits peaked at {peak:,} bytes against a budget of {BUDGET:,}"
    for split in (splits.train, splits.val):
        assert isinstance(split.images, ImageRows) and isinstance(split.images.base, np.memmap)
    assert splits.train.images.base is splits.val.images.base  # one map, two index arrays: no copy
    assert (len(splits.train), len(splits.val)) == (180, 60)

    paths, labels, _ = scan_classes(tmp_path / "data" / "train")
    tr, va = stratified_split(labels, 0.25, seed=0)
    for name, rows in (("train", tr), ("val", va)):
        want = [(_digest(np.asarray(Image.open(paths[r]))), int(labels[r])) for r in rows]
        assert seen[name] == want, f"{name}: the pixels or labels read differ from the files'"


def test_the_evaluation_shard_is_a_view_with_the_right_rows(tmp_path):
    _files(tmp_path / "data")
    splits = load_data(str(tmp_path / "data"), val_split=0.25, cache_dir=tmp_path / "cache", progress=False)
    val = splits.val
    shard = eval_shard(val, 1, 2)  # rank 1 of 2
    assert isinstance(shard.images, ImageRows) and shard.images.base is val.images.base
    assert np.array_equal(np.asarray(shard.images), np.asarray(val.images)[1::2])
    assert np.array_equal(shard.labels, val.labels[1::2])
    # on a plain in-memory split the shard holds what the copying code made: images[rank::world]
    plain = ImageArray(np.asarray(val.images), val.labels)
    for rank in (0, 1, 2):
        s = eval_shard(plain, rank, 3)
        idx = np.arange(rank, len(plain), 3)
        assert np.array_equal(np.asarray(s.images), plain.images[idx]) and np.array_equal(s.labels, plain.labels[idx])
    assert sum(len(eval_shard(plain, r, 3)) for r in range(3)) == len(plain)


_BASE = np.arange(12 * 2 * 3 * 1, dtype=np.int64).reshape(12, 2, 3, 1)


@st.composite
def _row_key(draw, n: int):
    kind = draw(st.sampled_from(["int", "slice", "ints", "mask"]))
    if kind == "int":
        return draw(st.integers(-n, n - 1)) if n else 0
    if kind == "slice":
        return draw(st.slices(max(n, 1)))
    if kind == "ints":
        return np.asarray(draw(st.lists(st.integers(-n, n - 1), max_size=8)) if n else [], dtype=np.int64)
    return np.asarray(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_image_rows_index_like_numpy(data):
    n = len(_BASE)
    idx = np.asarray(data.draw(st.lists(st.integers(-n, n - 1), max_size=10)), dtype=np.int64)
    view, ref = ImageRows(_BASE, idx), _BASE[idx]
    inner = np.asarray(
        data.draw(st.lists(st.integers(-len(idx), len(idx) - 1), max_size=6)) if len(idx) else [], dtype=np.int64
    )
    nested, nested_ref = ImageRows(view, inner), ref[inner]
    assert nested.base is _BASE  # composed, not chained
    for v, r in ((view, ref), (nested, nested_ref)):
        assert (v.shape, v.ndim, v.dtype, len(v)) == (r.shape, r.ndim, r.dtype, len(r))
        assert np.array_equal(np.asarray(v), r)
        key = data.draw(_row_key(len(r)))
        if len(r) == 0 and isinstance(key, int):
            with pytest.raises(IndexError):
                v[key]
            continue
        got = v[key]
        assert isinstance(got, np.ndarray) and np.array_equal(got, r[key]) and got.shape == r[key].shape


def test_image_rows_rejects_what_it_cannot_do_without_copying():
    view = ImageRows(_BASE, [3, 1])
    with pytest.raises(IndexError):
        ImageRows(_BASE, [len(_BASE)])
    with pytest.raises(IndexError):
        ImageRows(_BASE, np.ones(3, dtype=bool))
    assert np.array_equal(ImageRows(_BASE, np.arange(len(_BASE)) % 5 == 0).index, [0, 5, 10])
    with pytest.raises(IndexError):
        view[2]
    with pytest.raises(TypeError):
        view[0, 0]
    with pytest.raises(ValueError):
        np.array(view, copy=False)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512M", 512 << 20),
        ("2G", 2 << 30),
        ("64MiB", 64 << 20),
        ("1048576", 1 << 20),
        ("1.5g", 3 << 29),
        ("10kB", 10_000),
        ("1MB", 10**6),
    ],
)
def test_memory_budget_spellings(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["lots", "0", "-1M", "1e6", "12 parsecs", "M"])
@pytest.mark.parametrize("command", ["train", "finetune", "eval"])
def test_a_bad_memory_budget_is_one_line_naming_the_option(tmp_path, capsys, command, bad):
    where = (
        ["--init", str(tmp_path / "m")]
        if command == "finetune"
        else ["--model", str(tmp_path / "m")]
        if command == "eval"
        else []
    )
    argv = [
        command,
        *where,
        "--data",
        str(tmp_path / "no-such-data"),
        f"--memory-budget={bad}",
    ]  # "=": argparse would take -1M for an option
    assert main([*argv, "--out", str(tmp_path / "run"), "--no-progress"] if command != "eval" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"vitlab {command}: error: --memory-budget {bad!r} is not a size"), (
        err
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_memory_budget_reaches_the_decode_cache(tmp_path, monkeypatch, capsys):
    data = tiny_folder(tmp_path / "data", per_class=4, test_per_class=2)
    seen: list[int] = []
    real = vitlab.data.sources.decode_files

    def spy(*args, **kwargs):
        seen.append(kwargs["buffer_bytes"])
        return real(*args, **kwargs)

    monkeypatch.setattr(vitlab.data.sources, "decode_files", spy)
    out = tmp_path / "run"
    tiny = [
        "--dim",
        "16",
        "--depth",
        "1",
        "--heads",
        "2",
        "--patch-size",
        "4",
        "--recipe",
        "digits",
        "--batch-size",
        "4",
    ]
    common = ["--data", str(data), "--cache-dir", str(tmp_path / "cache"), "--workers", "0", "--no-progress", *tiny]
    assert main(["train", *common, "--memory-budget", "1M", "--stop-after", "1", "--out", str(out)]) == 0
    assert seen == [1 << 20, 1 << 20]  # train/ and test/
    saved = TrainConfig.from_dict(json.loads(load_state(out / "last.pt")["config"]))  # the JSON a resume reads
    assert saved.memory_budget == 1 << 20
