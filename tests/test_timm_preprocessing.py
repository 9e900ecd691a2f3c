"""timm's preprocessing habit on vitlab models (issue 36): ``timm.data.resolve_data_config({}, model=...)`` and
``create_transform`` give the pixels of vitlab's evaluation, so a timm-style script scores a vitlab run as
``vitlab eval`` does; ``vitlab.transforms_for`` is the same preprocessing for plain PyTorch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.evaluate import model_inputs

timm = pytest.importorskip("timm")
from timm.data import create_transform, resolve_data_config  # noqa: E402

MEAN, STD = (0.31, 0.42, 0.63), (0.21, 0.26, 0.33)  # not ImageNet's, not 0.5


def _tiny(tmp_path, **kw):
    """A tiny model with its own statistics and crop 1.0 (as `vitlab train` saves one), saved and loaded back."""
    torch.manual_seed(0)
    m = vitlab.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=3, mean=MEAN, std=STD
    )
    with torch.no_grad():
        m.head.weight.normal_(std=2.0)
    vitlab.save(m, tmp_path / "m")
    return vitlab.load(tmp_path / "m", **kw)


def _images() -> list[np.ndarray]:
    """Generated uint8 images: the model's size, larger and smaller, square and not."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((32, 32), (48, 48), (24, 20), (32, 32))]


def test_resolve_data_config_reproduces_vitlab_eval_pixels_and_predictions(tmp_path):
    model = _tiny(tmp_path)
    cfg = resolve_data_config({}, model=model)
    assert cfg["input_size"] == (3, 32, 32) and cfg["crop_pct"] == 1.0
    assert tuple(cfg["mean"]) == MEAN and tuple(cfg["std"]) == STD
    tf = create_transform(**cfg)
    imgs = _images()
    theirs = torch.stack([tf(Image.fromarray(a)) for a in imgs])
    ours = model_inputs(model, imgs)  # what `vitlab eval` feeds the model for these decoded images
    assert theirs.shape == ours.shape
    assert (theirs - ours).abs().max().item() <= 1e-6
    with torch.no_grad():
        assert torch.equal(model(theirs).argmax(1), model(ours).argmax(1))
    # and vitlab.transforms_for, from PIL images or uint8 tensors, is the same
    plain = vitlab.transforms_for(model)
    for a, want in zip(imgs, ours):
        assert (plain(Image.fromarray(a)) - want).abs().max().item() <= 1e-6
        assert (plain(torch.from_numpy(a).permute(2, 0, 1)) - want).abs().max().item() <= 1e-6


def test_pretrained_cfg_carries_timms_keys_and_follows_the_config(tmp_path):
    model = _tiny(tmp_path)
    cfg = model.pretrained_cfg
    assert model.default_cfg == cfg
    assert cfg["classifier"] == "head" and cfg["first_conv"] == "patch_embed.proj"
    assert cfg["num_classes"] == 3 and cfg["interpolation"] == "bilinear" and cfg["crop_mode"] == "squash"
    assert dict(model.named_modules())[cfg["first_conv"]] is model.patch_embed.proj
    model.reset_classifier(0)
    assert model.pretrained_cfg["num_classes"] == 0
    grey = vitlab.create_model("vit_ti16", img_size=32, in_chans=1, mean=MEAN, std=STD)
    assert grey.pretrained_cfg["input_size"] == (1, 32, 32) and grey.pretrained_cfg["mean"] == MEAN[:1]
    hybrid = vitlab.create_model("vit_r_ti16", img_size=64, depth=1)
    assert dict(hybrid.named_modules())[hybrid.pretrained_cfg["first_conv"]] is hybrid.patch_embed.backbone.conv
    distilled = vitlab.create_model("deit_tiny_distilled_patch16_224", depth=1)
    assert distilled.pretrained_cfg["classifier"] == ("head", "head_dist")


def test_timm_names_carry_timms_evaluation_crop():
    """The crop of each timm name is that of timm's default weights for it (0.9 at 224 px, 1.0 at 384 ...)."""
    from timm.models import get_pretrained_cfg

    from vitlab.models.registry import TIMM_ALIASES

    checked = 0
    for name in TIMM_ALIASES:
        ref = get_pretrained_cfg(name)
        if ref is None:  # no weights in timm for this size
            continue
        with torch.device("meta"):
            ours = vitlab.models.create_model(name).pretrained_cfg
        assert (ours["crop_pct"], ours["input_size"]) == (ref.crop_pct, ref.input_size), name
        checked += 1
    assert checked > 40
    assert vitlab.models.create_model("vit_ti16", img_size=32).config.crop_pct == 1.0  # vitlab's own evaluation


def test_crop_pct_is_a_field_and_a_runs_recorded_crop_sets_it(tmp_path):
    m = vitlab.VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=1, num_heads=2, mlp_dim=16)
    vitlab.save(m, tmp_path / "a", extra={"crop_pct": 0.875, "recipe": "x"})  # as a run's model/ records it
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["crop_pct"] == 0.875 and "crop_pct" not in saved["extra"]
    assert vitlab.load(tmp_path / "a").config.crop_pct == 0.875
    old = dict(saved, extra={"crop_pct": 0.9})  # written before crop_pct was a field
    del old["crop_pct"]
    (tmp_path / "a" / "config.json").write_text(json.dumps(old))
    loaded = vitlab.load(tmp_path / "a")
    assert loaded.config.crop_pct == 0.9 and loaded.pretrained_cfg["crop_pct"] == 0.9
    with pytest.raises(vitlab.ConfigError, match="crop_pct"):
        vitlab.ViTConfig(crop_pct=1.5)


def test_hf_folder_keeps_its_processors_crop(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    transformers.ViTModel(cfg).eval().save_pretrained(tmp_path / "vit")
    proc = transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=MEAN, image_std=STD)
    proc.save_pretrained(tmp_path / "vit")
    model = vitlab.load(tmp_path / "vit")
    assert model.pretrained_cfg["crop_pct"] == 1.0 and model.pretrained_cfg["mean"] == MEAN
    pre = json.loads((tmp_path / "vit" / "preprocessor_config.json").read_text())
    pre.update(do_center_crop=True, size={"height": 36, "width": 36}, crop_size={"height": 32, "width": 32})
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps(pre))  # DeiT's processor: resize, crop
    assert vitlab.load(tmp_path / "vit").config.crop_pct == pytest.approx(32 / 36)


def test_a_timm_script_scores_a_vitlab_run_as_vitlab_eval(tmp_path, capsys):
    """The issue's check: a run trained on its data's own statistics, scored by `vitlab eval` and by a timm-style
    script (resolve_data_config + create_transform over the image files): the same inputs, the same confusion
    matrix (on these easy images timm's ImageNet defaults happen to score the same: the inputs tell them apart)."""
    from imagefolder import tiny_folder
    from vitlab.cli import main

    data = tiny_folder(tmp_path / "d")
    run = tmp_path / "r"
    tiny = ["--dim", "16", "--depth", "1", "--heads", "2", "--patch-size", "4"]
    common = ["--data", str(data), "--cache-dir", str(tmp_path / "c"), "--recipe", "digits", "--batch-size", "8"]
    assert main(["train", *common, *tiny, "--epochs", "2", "--out", str(run), "--no-progress"]) == 0
    assert main(["eval", "--model", str(run), "--data", str(data), "--cache-dir", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    ev = json.loads((run / "eval.json").read_text())

    model = vitlab.load(run)
    assert tuple(model.pretrained_cfg["mean"]) != (0.485, 0.456, 0.406)  # the data's own statistics
    tf = create_transform(**resolve_data_config({}, model=model))
    names = ev["class_names"]
    confusion = np.zeros((len(names), len(names)), dtype=np.int64)
    with torch.no_grad():
        for label, name in enumerate(names):
            for f in sorted((data / "test" / name).glob("*.png")):
                image = Image.open(f).convert("RGB")
                x = tf(image)[None]
                assert (x - model_inputs(model, [np.asarray(image)])).abs().max().item() <= 1e-6  # the same pixels
                confusion[label, int(model(x).argmax(1))] += 1
    assert confusion.tolist() == ev["confusion"]
    assert np.trace(confusion) / confusion.sum() == pytest.approx(ev["top1"])
