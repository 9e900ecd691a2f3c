"""The decode cache stores images at the size training needs, says where it is and how big, and
``vitlab cache ls|clear`` list and delete it."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from PIL import Image

from vitlab.cli import main
from vitlab.data.cache.admin import clear_caches, list_caches
from vitlab.data.cache.store import decode_files
from vitlab.data.images.decode import decode_image
from vitlab.train import TrainConfig, fit, get_recipe


def photos(root, *, n: int = 6, size=(160, 120), classes=("a", "b")):
    """Landscape JPEG "photos", the class in the dominant colour; returns the paths."""
    rng = np.random.default_rng(0)
    paths = []
    for split, k in (("train", n), ("val", 2)):
        for c, name in enumerate(classes):
            d = root / split / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(k):
                arr = rng.integers(0, 80, (size[1], size[0], 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i}.jpg", quality=90)
                paths.append(str(d / f"{i}.jpg"))
    return paths


def test_native_size_is_capped_keeping_the_aspect_ratio(tmp_path):
    paths = photos(tmp_path / "p")
    native = decode_files(paths, cache_dir=tmp_path / "c1", progress=False)
    assert native.images.shape[1:] == (120, 160, 3)  # no cap asked: as before
    capped = decode_files(paths, cache_dir=tmp_path / "c2", progress=False, max_side=30)
    assert capped.images.shape == (len(paths), 30, 40, 3)  # shorter side 30, aspect kept, nothing cropped
    assert capped.path is not None and capped.path.stat().st_size == len(paths) * 30 * 40 * 3
    again = decode_files(paths, cache_dir=tmp_path / "c2", progress=False, max_side=30)  # found, not rebuilt
    assert again.path == capped.path and np.array_equal(np.asarray(again.images), np.asarray(capped.images))
    big = decode_files(paths, cache_dir=tmp_path / "c3", progress=False, max_side=500)  # smaller than the cap
    assert big.images.shape[1:] == (120, 160, 3)


def test_shorter_side_follows_exif_rotation_and_draft_rounding(tmp_path):
    """A portrait stored sideways (EXIF orientation 6) and a size that JPEG draft mode cannot divide
    exactly both give the shape the cache reserved."""
    arr = np.random.default_rng(1).integers(0, 255, (123, 171, 3)).astype(np.uint8)
    im = Image.fromarray(arr)
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(tmp_path / "turned.jpg", exif=exif)
    out = decode_image(tmp_path / "turned.jpg", shorter_side=20)
    assert out.shape == (27, 20, 3)  # 171x123 turned to 123x171, shorter side 20, int(20 * 171 / 123)


def test_mixed_sizes_are_cropped_no_larger_than_the_cap(tmp_path):
    paths = photos(tmp_path / "p", n=2, size=(160, 120)) + photos(tmp_path / "q", n=2, size=(100, 90))
    dec = decode_files(paths, cache_dir=tmp_path / "c", progress=False, fallback_size=64, max_side=40)
    assert dec.images.shape[1:] == (40, 40, 3)


def _config(data, out, **kw):
    recipe = get_recipe("small-data", epochs=1, batch_size=8, warmup_epochs=1)
    return TrainConfig(
        recipe=recipe,
        data=str(data),
        out=str(out),
        arch={"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2},
        cache_dir=str(out.parent / "cache"),
        workers=0,
        progress=False,
        **kw,
    )


@pytest.mark.slow
def test_training_caches_at_the_training_size_and_says_where(tmp_path, capsys):
    """The issue's case: large photos trained at a small --img-size used to be cached whole."""
    photos(tmp_path / "photos", size=(320, 240))
    summary = fit(_config(tmp_path / "photos", tmp_path / "run", img_size=48))
    assert summary["steps"] >= 1
    entries = list_caches(tmp_path / "cache")
    assert len(entries) == 2  # train and val
    side = 54  # floor(48 / 0.875), ~1.14 x: the cache's margin over the model input for random crops
    per_image = side * int(320 * side / 240) * 3  # torchvision's Resize(int) rule for the longer side
    per_eval = 54 * 54 * 3  # evaluation images: resized to floor(48 / crop_pct 0.875) (photos), centre-cropped
    assert sum(e.bytes - e.path.with_suffix(".json").stat().st_size for e in entries) == 12 * per_image + 4 * per_eval
    assert {e.source for e in entries} == {str(tmp_path / "photos" / "train"), str(tmp_path / "photos" / "val")}
    out = capsys.readouterr()
    line = [s for s in (out.out + out.err).splitlines() if s.startswith("decode cache:")]
    assert len(line) == 1 and str(tmp_path / "cache") in line[0] and "KiB" in line[0]


def test_cache_ls_and_clear(tmp_path, capsys):
    paths = photos(tmp_path / "p", n=2)
    cache = tmp_path / "cache"
    old = decode_files(paths[:4], cache_dir=cache, name="old", progress=False)
    decode_files(paths[4:], cache_dir=cache, name="new", progress=False)
    (cache / "unrelated.json").write_text("{}")  # not a decode cache: never listed or deleted
    (cache / "cifar-10-batches-py").mkdir()
    week_ago = time.time() - 8 * 86400
    os.utime(old.path, (week_ago, week_ago))

    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "old-" in out and "new-" in out and "2 cache(s)" in out and str(tmp_path / "p") in out

    assert main(["cache", "clear", "--cache-dir", str(cache), "--older-than", "7d"]) == 0
    assert "deleted 1 cache(s)" in capsys.readouterr().out
    assert [e.path.name.split("-")[0] for e in list_caches(cache)] == ["new"]
    assert not old.path.exists() and not old.path.with_suffix(".json").exists()

    assert [e.images for e in clear_caches(cache)] == [4]
    assert list_caches(cache) == [] and (cache / "unrelated.json").exists() and (cache / "cifar-10-batches-py").is_dir()
    assert main(["cache", "ls", "--cache-dir", str(cache)]) == 0
    assert "no decode caches" in capsys.readouterr().out


def test_cache_bad_input_is_one_line(tmp_path, capsys):
    assert main(["cache", "ls", "--cache-dir", str(tmp_path), "--older-than", "1d"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vitlab cache: error:")
    with pytest.raises(SystemExit) as e:
        main(["cache", "clear", "--older-than", "soon"])
    assert e.value.code == 2
