"""Data sources, the decode cache and the transforms."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

from vitlab.data import ArrayDataset, DataError, eval_transform, load_data, mix_transform, train_transform
from vitlab.data.cache import store as cache_mod
from vitlab.data.sources import stratified_split

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def make_folder(root, *, per_class=6, size=12, split=True, extras=True):
    """A tiny ImageFolder: one solid colour per class (plus noise), PNG and JPEG."""
    rng = np.random.default_rng(0)
    for sub in ("train", "val") if split else ("",):
        for name, rgb in COLORS.items():
            d = root / sub / name
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                arr = np.clip(np.array(rgb)[None, None] + rng.integers(-20, 20, (size, size, 3)), 0, 255).astype(
                    np.uint8
                )
                Image.fromarray(arr).save(d / f"{i}.{'png' if i % 2 else 'jpg'}")
    if extras:
        d = root / ("train" if split else "") / "red"
        Image.new("L", (size, size), 80).save(d / "gray.png")
        Image.new("P", (size, size), 3).save(d / "palette.png")
        Image.new("RGBA", (size, size), (200, 10, 10, 128)).save(d / "rgba.png")
        (d / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    return root


def test_digits_embedded_split_is_fixed_and_stratified():
    a, b = load_data("digits"), load_data("digits")
    assert (len(a.train), len(a.val)) == (1437, 360)
    assert a.train.images.shape[1:] == (8, 8, 1) and a.train.images.dtype == np.uint8
    assert a.train.images.max() == 255 and a.class_names == [str(i) for i in range(10)]
    np.testing.assert_array_equal(a.val.labels, b.val.labels)
    np.testing.assert_array_equal(a.val.images, b.val.images)
    counts = np.bincount(a.val.labels)
    assert counts.min() >= 35 and counts.max() <= 37  # 20% of ~180 per class


def test_a_held_out_split_smaller_than_the_class_count_is_a_random_split_not_a_crash():
    """24 photos in 4 classes: 10% is 3 images, fewer than the classes (scikit-learn refused to stratify)."""
    labels = np.repeat(np.arange(4), 6)
    tr, va = stratified_split(labels, 0.1, seed=0)
    assert len(va) == 3 and len(tr) == 21 and not set(tr) & set(va)
    with pytest.raises(DataError, match="leaves no training or no evaluation image"):
        stratified_split(np.zeros(1, dtype=np.int64), 0.5)


def test_stratified_split_keeps_class_ratios():
    labels = np.repeat(np.arange(4), [100, 50, 20, 10])
    tr, va = stratified_split(labels, 0.1, seed=0)
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(180))
    np.testing.assert_array_equal(np.bincount(labels[va]), [10, 5, 2, 1])
    _tr2, va2 = stratified_split(labels, 0.1, seed=0)
    np.testing.assert_array_equal(va, va2)


def test_folder_train_val_with_bad_file_conversions_and_cache(tmp_path, monkeypatch):
    root = make_folder(tmp_path / "ds")
    cache = tmp_path / "cache"
    s = load_data(str(root), cache_dir=cache, progress=False)
    assert s.class_names == ["blue", "green", "red"] and s.val_name == "val"
    assert len(s.train) == 18 + 3 and len(s.val) == 18  # gray, palette and RGBA converted; broken skipped
    assert [os.path.basename(p) for p, _ in s.skipped] == ["broken.jpg"]
    assert s.train.images.shape[1:] == (12, 12, 3)
    # a gray file becomes three equal channels
    files = sorted((root / "train" / "red").iterdir())
    kept_names = [f.name for f in files if f.name != "broken.jpg"]
    gi = kept_names.index("gray.png")
    red_idx = np.flatnonzero(s.train.labels == 2)
    assert (s.train.images[red_idx[gi]] == 80).all()
    # second load: served from the memory-mapped cache, nothing decoded
    monkeypatch.setattr(cache_mod, "decode_image", lambda *a, **k: pytest.fail("decoded again"))
    s2 = load_data(str(root), cache_dir=cache, progress=False)
    assert isinstance(s2.train.images, np.memmap)
    np.testing.assert_array_equal(s2.train.images, s.train.images)


def test_cache_key_changes_when_a_file_changes(tmp_path):
    root = make_folder(tmp_path / "ds", extras=False)
    cache = tmp_path / "cache"
    load_data(str(root), cache_dir=cache, progress=False)
    n = len(list(cache.glob("*.u8")))
    f = root / "train" / "red" / "0.jpg"
    Image.new("RGB", (12, 12), (0, 0, 0)).save(f)
    os.utime(f, ns=(1, 1))
    s = load_data(str(root), cache_dir=cache, progress=False)
    assert len(list(cache.glob("*.u8"))) == n + 1
    assert s.train.images[np.flatnonzero(s.train.labels == 2)[0]].max() == 0


def test_strict_data_raises_one_clear_error(tmp_path):
    root = make_folder(tmp_path / "ds")
    with pytest.raises(DataError, match=r"broken\.jpg"):
        load_data(str(root), cache_dir=tmp_path / "c", strict=True, progress=False)


def test_single_tree_with_val_split_and_mixed_sizes(tmp_path):
    root = make_folder(tmp_path / "ds", split=False, extras=False, per_class=10)
    Image.new("RGB", (30, 20), (10, 200, 10)).save(root / "green" / "big.png")
    s = load_data(str(root), val_split=0.2, size=16, cache_dir=tmp_path / "c", progress=False)
    assert len(s.train) + len(s.val) == 31 and s.val_name == "val"
    assert np.bincount(s.val.labels).tolist() in ([2, 3, 2], [2, 2, 3], [3, 2, 2])
    assert s.train.images.shape[1:] == (16, 16, 3)


def test_bad_specs_raise_data_errors(tmp_path):
    with pytest.raises(DataError, match="not 'digits'"):
        load_data(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        load_data(str(tmp_path / "empty"), cache_dir=tmp_path / "c")


def test_transforms_shapes_and_normalisation():
    x = torch.full((1, 8, 8), 255, dtype=torch.uint8)
    t = train_transform(
        img_size=16, mean=(0.5,) * 3, std=(0.5,) * 3, in_chans=1, hflip=0.5, randaugment=(2, 9), random_erasing=0.0
    )
    y = t(x)
    assert y.shape == (1, 16, 16) and y.dtype == torch.float32
    e = eval_transform(img_size=16, mean=(0.5,) * 3, std=(0.5,) * 3, in_chans=1)
    torch.testing.assert_close(e(x), torch.ones(1, 16, 16))
    ds = ArrayDataset(np.zeros((2, 8, 8, 1), np.uint8), np.array([0, 1]), transform=e, in_chans=3)
    img, label = ds[1]
    assert img.shape == (3, 16, 16) and label == 1
    torch.testing.assert_close(img, -torch.ones(3, 16, 16))


def test_train_transform_gives_torchvisions_pixels_and_draws():
    """The training transform's flip and normalisation are torchvision's v2 kernels called directly: under the same
    seed the same images as the v2 transforms (RandomHorizontalFlip, ToDtype, Normalize), flipped or not alike."""
    from torchvision.transforms import v2

    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    ours = train_transform(img_size=12, mean=mean, std=std, crop_scale=(0.35, 1.0), hflip=0.5)
    ref = v2.Compose([v2.RandomResizedCrop(12, scale=(0.35, 1.0), antialias=True), v2.RandomHorizontalFlip(0.5),
                      v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])  # fmt: skip
    x = torch.randint(0, 256, (3, 20, 27), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    plain = v2.Compose([ref.transforms[0], *ref.transforms[2:]])  # the same crop, never flipped
    flips = []
    for seed in range(12):
        torch.manual_seed(seed)
        a = ours(x)
        torch.manual_seed(seed)
        assert torch.equal(a, ref(x)), seed
        torch.manual_seed(seed)
        flips.append(not torch.equal(a, plain(x)))
    assert any(flips) and not all(flips)  # both branches of the flip were compared


def test_mixup_cutmix_give_soft_targets():
    assert mix_transform(num_classes=10) is None
    torch.manual_seed(0)
    m = mix_transform(num_classes=4, mixup=0.8, cutmix=1.0)
    _x, y = m(torch.rand(8, 3, 8, 8), torch.arange(8) % 4)
    assert y.shape == (8, 4)
    torch.testing.assert_close(y.sum(1), torch.ones(8))
    assert (y.max(1).values < 1).any()
