"""The one image decoder and the one channel rule (vitlab.data.images.decode), and that the commands share them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.data.images.decode import decode_image, image_size, is_image_name, match_channels
from vitlab.data.images.user_files import read_image
from vitlab.errors import InputError

ORIENTATION = 0x0112


def _half_black_half_white(w: int = 16, h: int = 8) -> np.ndarray:
    """Left half black, right half white: a picture whose turning is easy to see."""
    arr = np.zeros((h, w, 3), np.uint8)
    arr[:, w // 2 :] = 255
    return arr


def _save_with_orientation(path, arr: np.ndarray, orientation: int) -> None:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    Image.fromarray(arr).save(path, exif=exif.tobytes(), **({"quality": 95} if path.suffix == ".jpg" else {}))


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_exif_orientation_is_applied(tmp_path, suffix):
    # Orientation 6: the camera was turned, the viewer rotates the stored pixels 90 degrees clockwise,
    # so the stored left (black) half ends up at the top.
    path = tmp_path / f"turned{suffix}"
    _save_with_orientation(path, _half_black_half_white(), 6)
    arr = decode_image(path)
    assert arr.shape == (16, 8, 3)
    assert arr[:6].mean() < 20 and arr[-6:].mean() > 235
    assert image_size(path) == (8, 16)  # (width, height) as decoded, from the header alone
    assert read_image(path).shape == (16, 8, 3)
    assert decode_image(path, size=8).shape == (8, 8, 3)


def test_exif_orientation_reaches_the_decode_cache(tmp_path):
    from vitlab.data.cache.store import decode_files

    _save_with_orientation(tmp_path / "a.jpg", _half_black_half_white(), 6)
    Image.fromarray(_half_black_half_white(8, 16)).save(tmp_path / "b.png")  # stored upright at 8x16
    dec = decode_files([str(tmp_path / "a.jpg"), str(tmp_path / "b.png")], cache_dir=tmp_path / "cache", progress=False)
    assert dec.skipped == [] and dec.images.shape == (2, 16, 8, 3)  # one native size: both are 8 wide, 16 high
    assert dec.images[0, :6].mean() < 20 and dec.images[0, -6:].mean() > 235


def test_luma_rule_is_pils_and_round_trips_grey():
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (8, 32, 3), dtype=np.uint8)
    grey = match_channels(torch.from_numpy(rgb).permute(2, 0, 1), 1)[0].numpy()
    assert np.array_equal(grey, np.asarray(Image.fromarray(rgb).convert("L")))
    levels = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)
    assert torch.equal(match_channels(match_channels(levels, 3), 1), levels)  # white stays 255
    batch = torch.from_numpy(rgb).permute(2, 0, 1)[None].repeat(2, 1, 1, 1)
    assert match_channels(batch, 1).shape == (2, 1, 8, 32)
    with pytest.raises(InputError, match="4 channels"):
        match_channels(torch.zeros(4, 2, 2, dtype=torch.uint8), 3)


def test_grey_decode_is_the_luma_of_the_rgb_decode(tmp_path):
    # A JPEG too: libjpeg's own grey output would differ from the luma of the RGB pixels.
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(tmp_path / "c.jpg", quality=90)
    Image.new("LA", (16, 16), (90, 0)).save(tmp_path / "clear.png")  # transparent grey: white, in both modes
    for name in ("c.jpg", "clear.png"):
        rgb = torch.from_numpy(decode_image(tmp_path / name).copy()).permute(2, 0, 1)
        assert np.array_equal(decode_image(tmp_path / name, mode="L")[..., 0], match_channels(rgb, 1)[0].numpy())
    assert decode_image(tmp_path / "clear.png", mode="L").min() == 255


def test_image_names():
    assert is_image_name("a.JPG") and is_image_name("b.tiff") and is_image_name("c.webp")
    assert not is_image_name(".hidden.png") and not is_image_name("notes.txt")


def _folder(root):
    """train/ and val/ with RGB and grey files of mixed, non-square sizes (so the decode size matters)."""
    rng = np.random.default_rng(2)
    for split in ("train", "val"):
        for c, name in enumerate(("a", "b")):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(3):
                h, w = (20, 12) if i % 2 else (14, 18)
                rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                rgb[..., c] |= 0x80
                Image.fromarray(rgb).save(d / f"{i}.png")
            Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8), "L").save(d / "grey.png")
    return root


def _inputs_seen(model, run) -> torch.Tensor:
    """The input batches ``run()`` feeds the model's patch embedding, concatenated."""
    seen: list[torch.Tensor] = []
    handle = model.patch_embed.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    try:
        run()
    finally:
        handle.remove()
    return torch.cat(seen)


@pytest.mark.parametrize("in_chans", [1, 3])  # a grey model on RGB files, an RGB model on grey files
def test_fewshot_and_eval_feed_the_model_the_same_pixels(tmp_path, monkeypatch, in_chans):
    from vitlab.evaluate import evaluate_model
    from vitlab.evaluate.fewshot import FewShotConfig, evaluate_fewshot

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    data = str(_folder(tmp_path / "data"))
    torch.manual_seed(0)
    model = vitlab.create_model(
        "vit_ti16", img_size=16, patch_size=8, depth=1, in_chans=in_chans, num_classes=2, class_names=["a", "b"]
    ).eval()
    evaluated = _inputs_seen(model, lambda: evaluate_model(model, data, batch_size=3, progress=False))
    cfg = FewShotConfig(shots=(1,), seeds=1, probe=False, batch_size=3)
    fewshot = _inputs_seen(model, lambda: evaluate_fewshot(model, data, cfg, progress=False))
    assert evaluated.shape == (8, in_chans, 16, 16)
    assert torch.equal(fewshot[-len(evaluated) :], evaluated)  # the test split's inputs come last


def test_eval_stores_photos_at_the_resize_side_and_only_crops_them(tmp_path, monkeypatch):
    """``vitlab eval`` (and fewshot, which must see the same pixels) decodes a folder of photos for a model
    with timm's crop_pct once at the side the evaluation resizes to (floor(32 / 0.875) = 36, shorter side), as
    36-px squares placed for the centre crop: the transform's resize then finds nothing to do and the model sees the
    centre 32 x 32."""
    from vitlab.data.cache.admin import list_caches
    from vitlab.evaluate import decode_size, evaluate_model
    from vitlab.evaluate.fewshot import FewShotConfig, evaluate_fewshot

    monkeypatch.setenv("VITLAB_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for c, name in enumerate(("a", "b")):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(3):
                rgb = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
                rgb[..., c] |= 0x80
                Image.fromarray(rgb).save(tmp_path / "data" / split / name / f"{i}.png")
    model = vitlab.create_model(
        "vit_ti16", img_size=32, patch_size=8, depth=1, num_classes=2, class_names=["a", "b"], extra={"crop_pct": 0.875}
    ).eval()
    assert decode_size(model) == 36
    evaluated = _inputs_seen(model, lambda: evaluate_model(model, str(tmp_path / "data"), progress=False))
    (val,) = [e for e in list_caches(tmp_path / "cache") if e.path.name.startswith("data-val")]
    assert val.bytes - val.path.with_suffix(".json").stat().st_size == 6 * 36 * 36 * 3  # 120x160 -> 36x48 -> 36x36
    cfg = FewShotConfig(shots=(1,), seeds=1, probe=False, batch_size=3)
    fewshot = _inputs_seen(model, lambda: evaluate_fewshot(model, str(tmp_path / "data"), cfg, progress=False))
    assert evaluated.shape == (6, 3, 32, 32) and torch.equal(fewshot[-len(evaluated) :], evaluated)


def test_the_decodes_resize_and_crop_are_torchvisions():
    """The decode cache stores what timm's evaluation transform (torchvision's ``Resize(int)``, ``CenterCrop``)
    takes of an image: the longer side ``int(size * longer / shorter)``, and a square placed so that the
    evaluation's centre crop of it is ``CenterCrop(crop)`` of the whole resized image (two crops that each round
    half to even would not add up: round(0.5) + round(0.5) = 0, round(1.0) = 1)."""
    from torchvision.transforms.v2 import functional as F

    from vitlab.data.images.resize import centre_square, resized_shape

    for size in (7, 16, 17, 32):
        for h in range(1, 41, 3):
            for w in range(1, 41, 2):
                resized = F.resize(torch.zeros(1, h, w, dtype=torch.uint8), [size]).shape[1:]
                assert resized_shape(w, h, size) == (resized[1], resized[0]), (w, h, size)
    for size in range(5, 19):
        for long in range(size, size + 9):
            for crop in range(1, size + 1):
                index = torch.arange(size * long).view(1, size, long)  # a size x long image of its pixels' indices
                left, top, right, bottom = centre_square(long, size, size, crop)
                assert (right - left, bottom - top) == (size, size) and 0 <= left <= long - size and top == 0
                twice = F.center_crop(index[:, top:bottom, left:right], [crop, crop])
                assert torch.equal(twice, F.center_crop(index, [crop, crop])), (size, long, crop)


def test_evaluation_squares_are_decoded_at_full_scale_and_resized_as_timm_resizes(tmp_path):
    """A JPEG twice the evaluation's side is not decoded at a reduced DCT scale (PIL's draft mode) for the
    evaluation squares: PIL opens the whole file for timm's transform, and the squares hold its pixels."""
    from torchvision.transforms import v2

    rng = np.random.default_rng(5)
    Image.fromarray(rng.integers(0, 256, (90, 130, 3), dtype=np.uint8)).save(tmp_path / "p.jpg", quality=90)
    pil = Image.open(tmp_path / "p.jpg").convert("RGB")
    want = v2.CenterCrop(20)(v2.Resize(23, interpolation=v2.InterpolationMode.BICUBIC)(pil))
    square = decode_image(tmp_path / "p.jpg", size=23, crop=20)
    assert square.shape == (23, 23, 3)
    assert np.array_equal(np.asarray(v2.CenterCrop(20)(Image.fromarray(square))), np.asarray(want))
    with pytest.raises(ValueError, match="crop 24"):
        decode_image(tmp_path / "p.jpg", size=23, crop=24)
