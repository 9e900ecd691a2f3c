"""The same pixels everywhere (issue 56): ``vitlab.transforms_for`` applied to a path or to a PIL image gives what
``vitlab predict`` feeds the model (the one decoder: EXIF orientation, transparency on white, mode), an exported
folder's ``config.json`` states that whole contract, and the ONNX Runtime server printed in ``docs/deploy.md``
(extracted from the page and run as it is) predicts what ``vitlab predict`` predicts on EXIF-rotated phone
portraits and transparent PNGs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from conftest import assert_close_rel
from vitlab.cli import main
from vitlab.data.images.user_files import read_image
from vitlab.evaluate import model_inputs
from vitlab.models import VisionTransformer

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=4)
ORIENTATIONS = (3, 5, 6, 8)  # 180 degrees, transposed, 90 CW, 90 CCW: the last three make a portrait upright


def _scene(w: int, h: int, seed: int) -> np.ndarray:
    """An asymmetric picture (gradients and an off-centre block), so that a turn changes the pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([255 * x / w, 255 * y / h, 128 + 0 * x], -1)
    arr[: h // 3, : w // 4] = rng.integers(0, 255, 3)
    return arr.astype(np.uint8)


def _images(root: Path) -> list[Path]:
    """Phone-style JPEGs stored sideways with an EXIF orientation tag, and PNGs with transparency (RGBA with
    graded alpha, LA, a palette image with a transparent index)."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i, o in enumerate(ORIENTATIONS):
        exif = Image.Exif()
        exif[0x0112] = o
        path = root / f"portrait-{o}.jpg"
        Image.fromarray(_scene(60, 44, i)).save(path, exif=exif.tobytes(), quality=95)
        out.append(path)
    rgba = np.dstack([_scene(40, 52, 7), np.linspace(0, 255, 40 * 52).reshape(52, 40).astype(np.uint8)])
    Image.fromarray(rgba, "RGBA").save(root / "alpha-rgba.png")
    la = np.dstack([_scene(48, 36, 8)[..., 0], np.tile(np.linspace(255, 0, 48, dtype=np.uint8), (36, 1))])
    Image.fromarray(la, "LA").save(root / "alpha-la.png")
    pal = Image.fromarray(_scene(36, 36, 9)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.save(root / "alpha-palette.png", transparency=0)
    return [*out, root / "alpha-rgba.png", root / "alpha-la.png", root / "alpha-palette.png"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return _images(tmp_path_factory.mktemp("pixels") / "photos")


@pytest.fixture(scope="module")
def model() -> VisionTransformer:
    torch.manual_seed(0)
    m = VisionTransformer(**TINY, class_names=["a", "b", "c", "d"], crop_pct=0.9).eval()
    torch.nn.init.normal_(m.head.weight, std=0.5)  # (zero-initialised head: make the logits differ per image)
    return m


@pytest.mark.parametrize("form", ["path", "str", "pil"])
def test_transforms_for_gives_the_pixels_predict_feeds(images, model, form):
    """``transforms_for(model)`` of a path, or of ``Image.open(path)`` (the README's snippet), equals what
    ``vitlab predict`` feeds the model (before: a portrait stayed sideways; a path was refused)."""
    tf = vitlab.transforms_for(model)
    for path in images:
        naive = np.asarray(Image.open(path).convert("RGB"))  # (the files exercise the rules: a naive read differs)
        assert naive.shape != read_image(path).shape or not np.array_equal(naive, read_image(path)), path.name
        given = {"path": path, "str": str(path), "pil": Image.open(path)}[form]
        want = model_inputs(model, [read_image(path)])[0]
        got = tf(given)
        assert got.shape == want.shape and torch.equal(got, want), path.name


def test_transforms_for_a_one_channel_model_takes_the_luma(images):
    grey = VisionTransformer(**{**TINY, "in_chans": 1}).eval()
    tf = vitlab.transforms_for(grey)
    for path in images:
        want = model_inputs(grey, [read_image(path)])[0]
        assert torch.equal(tf(Image.open(path)), want) and torch.equal(tf(path), want), path.name


def test_transforms_for_a_read_only_array_hands_torch_a_writable_copy(images, model, monkeypatch):
    """``np.asarray(Image.open(p))`` is read-only, and torch warned ("The given NumPy array is not writable ...
    undefined behavior") to a user who did nothing wrong; the array's pixels are taken as they are."""
    handed = []
    from_numpy = torch.from_numpy

    def watched(a):
        handed.append(a.flags.writeable)
        return from_numpy(a)

    monkeypatch.setattr(torch, "from_numpy", watched)  # (torch warns once a process: watch what reaches it instead)
    decoded = read_image(images[0])
    frozen = np.asarray(Image.fromarray(decoded))
    assert not frozen.flags.writeable
    got = vitlab.transforms_for(model)(frozen)
    assert handed and all(handed), handed
    assert torch.equal(got, model_inputs(model, [decoded])[0])
    assert not frozen.flags.writeable  # the caller's array untouched


def test_transforms_for_an_array_with_alpha_or_16_bits_is_the_file_it_was_read_from(images, model, tmp_path):
    """``np.asarray(Image.open(p))`` of an RGBA or LA PNG (or its ``(C, H, W)`` tensor) lies on white and that of a
    16-bit PNG is scaled to 8 bits, as the file itself is (before: 4 or 2 channels were refused, and 16 bits were
    scaled by torch, not through the decoder's 8 bits)."""
    tf = vitlab.transforms_for(model)
    for name in ("alpha-rgba.png", "alpha-la.png"):
        path = next(p for p in images if p.name == name)
        arr = np.asarray(Image.open(path))
        assert arr.shape[-1] in (2, 4), arr.shape
        want = tf(path)
        assert torch.equal(tf(arr), want), name
        assert torch.equal(tf(torch.from_numpy(arr.copy()).permute(2, 0, 1)), want), name
    deep = (np.random.default_rng(3).integers(0, 65536, (30, 34))).astype(np.uint16)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"
    assert torch.equal(tf(np.asarray(Image.open(tmp_path / "deep.png"))), tf(tmp_path / "deep.png"))


@pytest.mark.parametrize("empty", ["array", "pil"])
def test_transforms_for_refuses_an_image_without_pixels(model, empty):
    """An image of no pixels is an :class:`~vitlab.errors.InputError` saying so (before: ZeroDivisionError)."""
    image = np.zeros((0, 7, 3), np.uint8) if empty == "array" else Image.new("RGB", (7, 0))
    with pytest.raises(vitlab.errors.InputError, match="7 x 0 pixels"):
        vitlab.transforms_for(model)(image)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory) -> Path:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from vitlab.deploy import ExportOptions, export_folder

    out = tmp_path_factory.mktemp("pixels") / "deploy"
    export_folder(model, out, ExportOptions(format="onnx", timing_runs=0))
    return out


@pytest.mark.slow
def test_config_states_the_whole_contract(exported, model):
    """The exported config says what the decoder does (EXIF, transparency, mode) and the geometry, mean, std and
    tensor layout the model takes (before: only timm's pretrained_cfg, which says nothing of EXIF or alpha)."""
    pre = json.loads((exported / "config.json").read_text())["preprocessing"]
    assert "exif" in pre["exif_orientation"].lower() and "white" in pre["transparency"]
    assert pre["mode"] == "RGB" and pre["resize"] == {
        "shorter_side": 35,
        "longer_side": "floor(shorter_side * longer / shorter)",
    }  # floor(32 / 0.9)
    assert pre["center_crop"] == [32, 32] and pre["mean"] == list(model.config.mean)
    assert pre["input"]["name"] == "pixel_values" and pre["input"]["layout"] == "NCHW"
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for words in ("EXIF", "on white", "preprocessing"):
        assert words in doc


def _doc_server(tmp_path: Path):
    """The server of docs/deploy.md, as printed: the python block that starts with ``# serve.py``."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if b.startswith("# serve.py")]
    assert len(blocks) == 1, "docs/deploy.md prints one server block starting with '# serve.py'"
    path = tmp_path / "serve.py"
    path.write_text(blocks[0])
    spec = importlib.util.spec_from_file_location("doc_serve", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_doc_server_matches_predict(exported, images, tmp_path, capsys):
    """The page's ONNX Runtime server (PIL, NumPy and onnxruntime only) gives every image the class and
    probability ``vitlab predict`` gives it, portraits and transparent PNGs included."""
    serve = _doc_server(tmp_path)
    got = serve.Classifier(exported)([str(p) for p in images])
    assert main(["predict", "--model", str(exported), *map(str, images), "--json", "--top", "1"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert len(got) == len(want) == len(images)
    for g, w in zip(got, want, strict=True):
        assert g["class"] == w["top"][0]["class"], w["image"]
        assert_close_rel(np.float32(g["prob"]), np.float32(w["top"][0]["prob"]), rtol=1e-4, msg=w["image"])
    assert len({w["top"][0]["prob"] for w in want}) > 1  # (the images give the model different inputs)
