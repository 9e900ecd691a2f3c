"""Prediction and evaluation at each image's own aspect ratio (evaluate/own_aspect.py, ``vitlab predict --native``):
a square image gives natively the logits of the usual path at the same size; other shapes keep their whole
picture on the model's token budget; the packed evaluation reports what the usual one does, plus padding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import assert_close_rel
from vitlab import accel
from vitlab.checkpoints import save
from vitlab.cli import main
from vitlab.data.images.rows import PackedImages
from vitlab.data.pipeline.navit import SizedImages, native_grid
from vitlab.data.pipeline.transforms import resize_image
from vitlab.data.shards.source import open_source
from vitlab.data.shards.write import pack_folder
from vitlab.errors import ConfigError
from vitlab.evaluate import (
    evaluate_batches,
    evaluate_native,
    model_inputs,
    native_batches,
    native_inputs,
    native_patchify,
)
from vitlab.models import VisionTransformer
from vitlab.models.packed import patchify

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3)).astype(np.uint8)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.mark.parametrize("side", [32, 48, 20])
@pytest.mark.parametrize("arch", [dict(), dict(pool="gap", class_token=False, posemb="learn2d", reg_tokens=1)])
def test_a_square_image_gives_natively_the_usual_logits(side, arch):
    model = accel.accelerate(randomised(VisionTransformer(**TINY, **arch, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25))))
    img = photo(side, side)
    packed = native_inputs(model, [img])
    assert packed.grids.tolist() == [[4, 4]] and packed.padding_fraction() == 0
    with torch.no_grad():
        assert_close_rel(model(packed), model(model_inputs(model, [img])))


def test_other_shapes_keep_their_whole_picture_on_the_models_budget():
    model = randomised(VisionTransformer(**TINY))
    imgs = [photo(60, 45, 1), photo(30, 80, 2), photo(40, 40, 3)]
    packed = native_inputs(model, imgs)
    grids = [native_grid(h, w, patch_size=8, max_tokens=16) for h, w in ((60, 45), (30, 80), (40, 40))]
    assert packed.grids.tolist() == [list(g) for g in grids] == [[4, 3], [2, 6], [4, 4]]
    with torch.no_grad():
        logits = model(packed)
        for i, (img, (gh, gw)) in enumerate(zip(imgs, grids, strict=True)):
            x = torch.from_numpy(img).permute(2, 0, 1)
            x = (resize_image(x, (gh * 8, gw * 8)).float() / 255 - 0.5) / 0.5  # the evaluation's resize rule
            assert_close_rel(logits[i], model(x[None])[0])
            assert_close_rel(packed.patches[i, 1 : 1 + gh * gw], patchify(x, 8).patches, rtol=1e-6)
    bigger = native_inputs(model, imgs, resolution=64)
    assert bigger.grids.tolist() == [[9, 6], [4, 13], [8, 8]]


def test_native_evaluation_reports_accuracy_padding_and_resolution():
    model = randomised(VisionTransformer(**TINY))
    shapes = [(32, 32), (40, 40), (24, 24), (64, 64), (32, 32), (16, 16), (48, 48)]
    data = np.concatenate([photo(h, w, i).ravel() for i, (h, w) in enumerate(shapes)])
    images = PackedImages(data, heights=[h for h, _ in shapes], widths=[w for _, w in shapes], chans=3)

    class Split:
        labels = np.asarray([0, 1, 2, 0, 1, 2, 0])

    Split.images = images
    res = evaluate_native(model, Split, sequences=3)
    usual = evaluate_batches(
        model,
        [(model_inputs(model, [images[i]]), torch.tensor([int(Split.labels[i])])) for i in range(7)],
        num_classes=3,
        device=torch.device("cpu"),
    )
    assert res["count"] == 7 and res["top1"] == usual["top1"]  # square images: the same predictions
    assert (res["confusion"] == usual["confusion"]).all()
    assert res["loss"] == pytest.approx(usual["loss"], rel=1e-5)
    assert res["padding"] == pytest.approx(2 / 9) and res["resolution"] == 32  # the last batch: 1 image, 2 empty
    # 3 x 3 patches + 1 class token, 3 images to a sequence of 34: 6 images (8 slots of padding), then 1 (58)
    packed = evaluate_native(model, Split, sequences=2, pack_len=34, resolution=24)
    assert packed["count"] == 7 and packed["resolution"] == 24 and packed["padding"] == pytest.approx(66 / 136)


def test_native_evaluation_over_tar_shards(tmp_path):
    from imagefolder import tiny_folder

    folder = tiny_folder(tmp_path / "f", per_class=2, test_per_class=2, size=16)
    pack_folder(folder, tmp_path / "shards", progress=False)
    src = open_source(str(tmp_path / "shards"), eval_only=True)
    model = randomised(VisionTransformer(**TINY))
    res = evaluate_native(model, src.val, num_classes=3, label_map=np.arange(3), sequences=4)
    assert res["count"] == 6 and sum(res["class_counts"]) == 6


def test_refused():
    model = randomised(VisionTransformer(**TINY))
    with pytest.raises(ConfigError, match="at least the patch size"):
        native_inputs(model, [photo(8, 8)], resolution=4)
    with pytest.raises(ConfigError, match="VisionTransformer"):
        native_inputs(torch.nn.Linear(2, 2), [photo(8, 8)])


def test_predict_native(tmp_path, capsys):
    model = randomised(VisionTransformer(**TINY, class_names=["a", "b", "c"]))
    save(model, tmp_path / "model")
    square, tall = tmp_path / "square.png", tmp_path / "tall.png"
    Image.fromarray(photo(48, 48)).save(square)
    Image.fromarray(photo(64, 24, 1)).save(tall)

    def predicted(*argv: str) -> list[dict]:
        assert main(["predict", "--model", str(tmp_path / "model"), "--json", *argv]) == 0
        return json.loads(capsys.readouterr().out)

    usual, native = predicted(str(square)), predicted("--native", str(square), str(tall))
    assert [t["class"] for t in native[0]["top"]] == [t["class"] for t in usual[0]["top"]]
    for a, b in zip(native[0]["top"], usual[0]["top"], strict=True):
        assert a["prob"] == pytest.approx(b["prob"], abs=2e-6)
    assert native[1]["image"] == str(tall) and len(native[1]["top"]) == 3
    assert predicted("--native", "--native-res", "64", str(tall))[0]["top"] != native[1]["top"]
    for argv, what in ((["--native-res", "40"], "only with --native"), (["--native", "--tome", "2"], "--tome")):
        assert main(["predict", "--model", str(tmp_path / "model"), *argv, str(square)]) == 2
        assert what in capsys.readouterr().err


def test_kept_images_give_the_same_native_batches_and_belong_to_one_model():
    """A training run evaluates the same split every epoch: its images kept resized (``sized``) give the batches
    resized anew give, and kept images of another model or resolution are refused."""
    model = randomised(VisionTransformer(**TINY))
    shapes = [(32, 48), (40, 24), (24, 24), (64, 40), (20, 36)]
    data = np.concatenate([photo(h, w, i).ravel() for i, (h, w) in enumerate(shapes)])

    class Split:
        images = PackedImages(data, heights=[h for h, _ in shapes], widths=[w for _, w in shapes], chans=3)
        labels = np.arange(5) % 3

    sized = SizedImages(Split.images, native_patchify(model))
    fresh = list(native_batches(model, Split, sequences=2))
    for _ in range(2):  # the first pass resizes and keeps, the second reads what was kept
        kept = list(native_batches(model, Split, sequences=2, sized=sized))
        assert len(kept) == len(fresh) and len(sized.kept) == 5
        for (a, la), (b, lb) in zip(kept, fresh, strict=True):
            assert torch.equal(a.patches, b.patches) and torch.equal(a.image_ids, b.image_ids) and torch.equal(la, lb)
    with pytest.raises(ConfigError, match="another model or resolution"):
        list(native_batches(model, Split, resolution=24, sized=sized))
