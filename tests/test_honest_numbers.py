"""Numbers that mean what they say (issue 36): a run records its data by an absolute path, announces the evaluation
split it held out, names the epoch its ``model/`` comes from, and its ``summary.json`` agrees with ``vitlab eval`` on
those weights; a shard run evaluates the pixels ``vitlab eval`` does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.data import channel_stats, load_data
from vitlab.data.shards.stream import EvalDecode, open_stream_data
from vitlab.distributed import Dist
from vitlab.evaluate.accuracy import preprocess_for
from vitlab.inspect.report import training_artifacts
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train.conf.train_config import build_config
from vitlab.train.engine.model import input_norm
from vitlab.train.engine.shards import build_shard_loaders
from vitlab.train.sizing import Sizing

TINY = ["--img-size", "8", "--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--no-progress"]


def _photos(root: Path, *, splits=("",), per_class: int = 10, size: int = 8, ext: str = "png") -> Path:
    """``root/[split/]class{0,1}/NN.ext``: class c has a bright channel c."""
    rng = np.random.default_rng(0)
    for split in splits:
        for c in range(2):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(per_class):
                arr = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
                arr[..., c] += 150
                Image.fromarray(arr).save(d / f"{i:02d}.{ext}")
    return root


@pytest.mark.slow
def test_a_run_records_its_data_absolutely_announces_its_split_and_agrees_with_eval(tmp_path, monkeypatch, capsys):
    """Before: config.json kept ``"data": "photos"`` (relative), 10% was held out silently, and model/ held the best
    epoch while summary.json reported the last one."""
    _photos(tmp_path / "photos")
    monkeypatch.chdir(tmp_path)
    args = ["train", "--data", "photos", "--out", "run", "--epochs", "3", "--cache-dir", str(tmp_path / "c"), *TINY]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "evaluation split: 2 of the 20 images held out (10% of each class, seed 0), as photos has no val/" in out
    assert "warning: 2 evaluation images (val), about 1 a class" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    photos = str((tmp_path / "photos").resolve())
    assert summary["data"]["path"] == photos and summary["data"]["fingerprint"]
    assert vitlab.load(tmp_path / "run" / "model").config.extra["data"] == photos
    assert (summary["keep"], summary["model_epoch"], summary["epochs"]) == ("last", 3, 3)
    assert summary["eval"]["images"] == 2 and summary["eval"]["top1_stderr"] > 10
    assert "model/: epoch 3" in out
    _, sections = training_artifacts(tmp_path / "run" / "model")  # the report's tables
    table = next(sec.table for sec in sections if sec.title == "Training summary")
    assert table["top1"] == float(f"{summary['top1']:.4g}") and table["model_epoch"] == 3
    # from another folder, without --data's relative name: the same weights, the same data, the same number
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    model = str(tmp_path / "run" / "model")
    assert main(["eval", "--model", model, "--data", photos, "--output", "e.json", "--cache-dir", "c"]) == 0
    ev = json.loads((elsewhere / "e.json").read_text())
    assert ev["count"] == 2 and ev["top1"] == summary["top1"]
    assert "(epoch 3 of its run)" in capsys.readouterr().out


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("honest_shards")
    _photos(root / "f", splits=("train", "test"), per_class=2, size=64, ext="jpg")
    assert main(["data", "pack", str(root / "f"), str(root / "p"), "--no-progress"]) == 0
    return root


def test_shard_training_evaluates_the_pixels_vitlab_eval_does(packed):
    """Before: the shard loader decoded evaluation JPEGs at a reduced DCT scale (draft mode), other pixels than
    ``vitlab eval``'s full-scale decode of the same file."""
    data = open_stream_data(str(packed / "p"))
    cfg = build_config({"data": str(packed / "p"), "recipe.batch_size": 2}, given={"recipe.batch_size"})
    mcfg = ViTConfig(img_size=(8, 8), patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=2)
    sizing = Sizing(recipe=cfg.recipe, micro=2, eval_batch=256, threads=1, workers=0)  # what a run chose: no workers
    loaders = build_shard_loaders(cfg, sizing, data=data, model_config=mcfg, dist=Dist(), device=torch.device("cpu"))
    x = loaders.eval_items(0, 1)[0]
    raw = loaders.probe_eval._items[0][0]  # the same sample's bytes
    y = EvalDecode(in_chans=3, tf=preprocess_for(VisionTransformer(mcfg)))(raw)  # vitlab eval's decode
    torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_shards_are_normalised_by_their_own_statistics_like_the_folder(packed, tmp_path):
    """Before: a shard run normalised by 0.5 / 0.5 while the same images in a folder used their own statistics."""
    data = open_stream_data(str(packed / "p"))
    mean, std = input_norm(build_config({"data": str(packed / "p")}), data)
    folder = load_data(str(packed / "f"), cache_dir=str(tmp_path / "c"), progress=False)
    fmean, fstd = channel_stats(folder.train.images, in_chans=3)
    np.testing.assert_allclose(mean + std, fmean + fstd, rtol=0.05)  # the shard's JPEGs decoded at their DCT scale
    assert max(abs(v - 0.5) for v in mean + std) > 0.1


@pytest.mark.parametrize(("per_class", "says"), [(1, "10% at random, seed 0; not of each class"),
                                                 (10, "10% of each class, seed 0")])  # fmt: skip
def test_the_split_line_says_whether_it_held_out_each_class(tmp_path, per_class, says):
    """A folder of one image a class cannot be split by class: its line said "10% of each class" while one class
    lost its only image to the evaluation; and "about 0 a class", "one image is 1e+02 points"."""
    from vitlab.data.sources import DataSource
    from vitlab.train.engine.run_data import eval_split_lines

    for c, colour in (("a", 40), ("b", 200)):
        (tmp_path / "photos" / c).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (colour, i, 0)).save(tmp_path / "photos" / c / f"{i}.png")
    data = load_data(str(tmp_path / "photos"), cache_dir=tmp_path / "cache", progress=False, size=8)
    lines = eval_split_lines(data, DataSource.named(str(tmp_path / "photos")))
    assert says in lines[0], lines
    if per_class == 1:
        assert "about 0.5 a class: one image is 100 points of top-1" in lines[1], lines


def test_a_test_folder_beside_val_is_named_as_left_alone(tmp_path):
    """train/, val/ and test/: the run evaluates val/ and said nothing of test/, which a user keeps for the end."""
    from vitlab.data.sources import DataSource
    from vitlab.train.engine.run_data import eval_split_lines

    root = tmp_path / "photos"
    for split in ("train", "val", "test"):
        for c, colour in (("a", 40), ("b", 200)):
            (root / split / c).mkdir(parents=True)
            for i in range(50):
                Image.new("RGB", (8, 8), (colour, i, 0)).save(root / split / c / f"{i}.png")
    data = load_data(str(root), cache_dir=tmp_path / "cache", progress=False, size=8)
    lines = eval_split_lines(data, DataSource.named(str(root)), out=tmp_path / "run")
    assert lines == [f"evaluation split: val/ (100 images); test/ left alone for a final test: vitlab eval --model "
                     f"{tmp_path / 'run' / 'model'} --data {root / 'test'}"]  # fmt: skip
    (root / "test").rename(root / "held")
    data = load_data(str(root), cache_dir=tmp_path / "cache", progress=False, size=8)
    assert eval_split_lines(data, DataSource.named(str(root)), out=tmp_path / "run") == []
