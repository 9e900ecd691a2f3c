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
from conftest import assert_close_rel
from imagefolder import photo_folder, tiny_folder
from vitlab.cli import main
from vitlab.models import ViTConfig
from vitlab.models.config import PROCESSOR_SIDE
from vitlab.train import TrainConfig, get_recipe
from vitlab.train.sizing.side import folder_storage, init_side

transformers = pytest.importorskip("transformers")


def _dinov2(folder: Path, *, crop: int | None, size: int = 32, registers: int = 0, image_size: int = 56) -> Path:
    """A tiny random DINOv2 of Hugging Face's at ``image_size`` px (56: a 4 x 4 table of patch 14), saved with an
    image processor that resizes the shorter side to ``size`` and crops the centre ``crop`` (None: no processor
    file)."""
    kw = {
        "image_size": image_size,
        "patch_size": 14,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
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


@pytest.mark.parametrize("registers", [0, 4])
def test_a_dinov2_folder_is_served_at_its_processor_s_side_with_hugging_face_s_features(tmp_path, registers):
    """Every command (``eval``, ``predict``, ``fewshot``, ``inspect``, ``export``, a teacher) serves the folder at the
    side its image processor crops to, as Hugging Face's pipeline feeds it, with Hugging Face's features there: the
    table resampled as each class resamples it (``Dinov2Model`` without antialiasing, ``Dinov2WithRegistersModel``
    with). Before, the commands ran it at its table's side (518 px for ``facebook/dinov2-*``: 5.3x the tokens of
    224), and a model run at 224 px resampled the table antialiased."""
    folder = _dinov2(tmp_path / "d", crop=56, size=64, image_size=112, registers=registers)
    model = vitlab.resolve_model(folder)
    assert model.config.img_size == (56, 56) and PROCESSOR_SIDE not in model.config.extra  # served, not re-served
    cls = transformers.Dinov2WithRegistersModel if registers else transformers.Dinov2Model
    ref = cls.from_pretrained(folder).eval()
    x = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(pixel_values=x).pooler_output
        assert_close_rel(model(x), want)
        assert_close_rel(vitlab.load(folder)(x), want)  # at 518 px's table, run at 224: the same
    assert vitlab.resolve_model(folder, img_size=112).config.img_size == (112, 112)  # a side given wins


def test_a_model_given_a_side_forgets_the_processor_s(tmp_path):
    """The processor's side describes the folder as Hugging Face saved it: a model built at a side it was given (a
    fine-tune at ``--img-size 518``, a ``convert --img-size``, ``set_input_size``) is served at its own."""
    folder = _dinov2(tmp_path / "d", crop=28)
    assert PROCESSOR_SIDE not in vitlab.load(folder, img_size=84).config.extra
    model = vitlab.load(folder)
    model.set_input_size(84)
    assert PROCESSOR_SIDE not in model.config.extra
    vitlab.save(model, tmp_path / "m")
    assert vitlab.resolve_model(tmp_path / "m").config.img_size == (84, 84)


def test_the_commands_say_the_side_they_serve_a_dinov2_folder_at(tmp_path, capsys):
    folder = _dinov2(tmp_path / "d", crop=28)
    assert main(["plan", "--model", str(folder), "--batch-size", "8", "--devices", "1", "--device-memory", "1G"]) == 0
    assert "at 28 px" in capsys.readouterr().out
    tiny_folder(tmp_path / "data", per_class=4, test_per_class=2, size=32)
    argv = [
        "fewshot",
        "--model",
        str(folder),
        "--data",
        str(tmp_path / "data"),
        "--shots",
        "1",
        "--seeds",
        "1",
        "--no-probe",
        "--out",
        str(tmp_path / "fs.json"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-progress",
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "served at 28 px, the side its Hugging Face image processor crops to" in err
    assert "(--img-size 56 where a command takes it)" in err


def test_a_fine_tuned_model_is_served_at_the_side_it_trained_at(tmp_path):
    """A fine-tune that keeps its ``--init`` model's side (small images, trained at the table's 56 px) saves a model
    of its own: the processor's 28 px no longer describes it, so the commands serve it at 56, as it trained. Before,
    it kept the key and would have been served at 28."""
    from vitlab.train.conf.train_config import build_config
    from vitlab.train.engine.model import InitModel

    cfg = build_config({"init": str(_dinov2(tmp_path / "d", crop=28)), "data": "unused"})
    assert cfg.img_size is None and cfg.recipe.img_size is None  # the recipe keeps the model's side
    model, _ = InitModel.read(cfg).build(cfg, cfg.recipe, num_classes=2, class_names=["a", "b"])
    assert model.config.img_size == (56, 56) and PROCESSOR_SIDE not in model.config.extra
