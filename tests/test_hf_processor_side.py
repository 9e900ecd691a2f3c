"""A Hugging Face folder whose image processor crops to another side than its ``config.json``'s ``image_size``
(``facebook/dinov2-*``: resize to 256, crop 224, a position table made for 518 px) keeps that side, and a fine-tune of
photos without ``--img-size`` trains at it, as Hugging Face's pipeline feeds and fine-tunes the model. Before, it
fine-tuned at 518 px: 5.3x the tokens of 224 px a step, on a CPU minutes a step for a ViT-S."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vitlab
from imagefolder import photo_folder
from vitlab.cli import main
from vitlab.models import ViTConfig
from vitlab.models.config import PROCESSOR_SIDE
from vitlab.train import TrainConfig, get_recipe
from vitlab.train.sizing.side import folder_storage, init_side

transformers = pytest.importorskip("transformers")


def _dinov2(folder: Path, *, crop: int | None, size: int = 32, registers: int = 0) -> Path:
    """A tiny random DINOv2 of Hugging Face's at 56 px (a 4 x 4 table of patch 14), saved with an image processor
    that resizes the shorter side to ``size`` and crops the centre ``crop`` (None: no processor file)."""
    kw = {"image_size": 56, "patch_size": 14, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    torch.manual_seed(0)
    if registers:
        model = transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**kw, mlp_ratio=2, num_register_tokens=registers)
        )
    else:
        model = transformers.Dinov2Model(transformers.Dinov2Config(**kw, mlp_ratio=2))
    model.eval().save_pretrained(folder)
    if crop is not None:
        pre = {"do_resize": True, "size": {"shortest_edge": size}, "do_center_crop": True,
               "crop_size": {"height": crop, "width": crop}, "resample": 3, "image_mean": [0.485, 0.456, 0.406],
               "image_std": [0.229, 0.224, 0.225]}  # fmt: skip
        (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    return folder


def test_the_processor_s_crop_is_kept_beside_the_table_s_side(tmp_path):
    model = vitlab.load(_dinov2(tmp_path / "d", crop=28))
    assert model.config.img_size == (56, 56) and model.config.extra[PROCESSOR_SIDE] == 28  # the weights as they are
    assert model.config.crop_pct == pytest.approx(28 / 32, abs=1e-6)
    same = vitlab.load(_dinov2(tmp_path / "s", crop=56, size=64))  # a crop at the table's side: nothing to keep
    assert PROCESSOR_SIDE not in same.config.extra
    assert PROCESSOR_SIDE not in vitlab.load(_dinov2(tmp_path / "n", crop=None)).config.extra


def test_a_fine_tune_of_photos_stores_and_trains_them_at_the_processor_s_side(tmp_path):
    init = vitlab.load(_dinov2(tmp_path / "d", crop=28)).config
    cfg = TrainConfig(recipe=get_recipe("auto"), data=str(tmp_path), out="unused", progress=False, init="d")
    plan = folder_storage(cfg, {(3024, 4032): 24}, init=init)
    assert plan.size == (28, 28)
    assert "(the --init model's image processor's crop, as Hugging Face feeds it)" in plan.line
    small = folder_storage(cfg, {(32, 32): 24}, init=init)  # small images: the model's side, as before
    assert small.size == (56, 56) and "the --init model's size" in small.line
    given = TrainConfig(recipe=get_recipe("auto"), data=str(tmp_path), out="unused", init="d", img_size=56)
    assert folder_storage(given, {(3024, 4032): 24}, init=init).size == (56, 56)  # --img-size wins


@pytest.mark.parametrize("fed", [28, 14, 42, 56, 70, 0, -28, True, "28", 28.0, None])
def test_a_recorded_side_is_taken_only_as_a_smaller_multiple_of_the_token(fed):
    """The key is read from a file: a side the model cannot take (not a multiple of the patch, not smaller, not an
    int) is not one, and the model's own side stands."""
    cfg = ViTConfig(img_size=(56, 56), patch_size=14, embed_dim=32, depth=1, num_heads=2, mlp_dim=64,
                    extra={} if fed is None else {PROCESSOR_SIDE: fed})  # fmt: skip
    want = fed if fed in (28, 14, 42) and type(fed) is int else 56
    assert init_side(cfg) == want and init_side(cfg, photos=False) == 56


@pytest.mark.slow
def test_vitlab_finetune_trains_a_dinov2_folder_at_its_processor_s_crop(tmp_path, capsys):
    """End to end: the first line names the side and why, and the model trains there (its table resampled)."""
    photo_folder(tmp_path / "photos", size=(640, 480), train=4, val=1)
    folder = _dinov2(tmp_path / "dinov2", crop=28)
    argv = ["finetune", "--init", str(folder), "--data", str(tmp_path / "photos"), "--epochs", "1", "--stop-after",
            "1", "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--workers",
            "0"]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "-> training at 28 px (the --init model's image processor's crop, as Hugging Face feeds it)" in said
    assert "28x28 px" in said and "56x56" not in said.split("training dinov2", 1)[-1].split("\n", 1)[0]
