"""Exact resume: stopping and continuing gives the same weights as never stopping."""

from __future__ import annotations

import json

import pytest
import torch

from imagefolder import tiny_folder
from vitlab.train import TrainConfig, fit, get_recipe
from vitlab.train.persist.state import load_state

pytestmark = pytest.mark.slow  # end to end: every test here trains whole runs (vitlab.train.fit)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("data") / "rgb")


def config(data_dir, out, **kw):
    # every random path at once: RandAugment, flips, random erasing, MixUp/CutMix, stochastic depth, EMA
    recipe = get_recipe("small-data", epochs=3, batch_size=16, warmup_epochs=1, drop_path=0.1, ema=0.9, lr=3e-3)
    return TrainConfig(
        recipe=recipe,
        data=str(data_dir),
        out=str(out),
        arch={"patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2},
        cache_dir=str(out.parent / "cache"),
        workers=0,  # augmentation in this process: resume is then bitwise exact, even mid-epoch
        progress=False,
        **kw,
    )


def metric_rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("epoch", "step", "train_loss", "lr", "top1", "top5")} for r in rows]


@pytest.fixture(scope="module")
def full_run(data_dir):
    out = data_dir.parent / "full"
    full = fit(config(data_dir, out))
    assert full["steps"] == 9 and full["epochs"] == 3 and not full["interrupted"]
    return out, full


@pytest.mark.parametrize("stop_after", [4, 6])  # mid-epoch (3 steps per epoch) and an epoch boundary
def test_resume_matches_an_uninterrupted_run(data_dir, full_run, tmp_path, stop_after):
    full_out, full = full_run

    part = fit(config(data_dir, tmp_path / "part", stop_after=stop_after))
    assert part["interrupted"] and part["steps"] == stop_after
    blob = load_state(tmp_path / "part" / "last.pt")  # weights_only=True
    assert blob["step"] == stop_after and blob["micro_in_epoch"] == stop_after % 3
    rest = fit(config(data_dir, tmp_path / "part"), resume=True)
    assert rest["steps"] == 9 and not rest["interrupted"]

    a = load_state(full_out / "last.pt")
    b = load_state(tmp_path / "part" / "last.pt")
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=0, msg=k)
    for k, v in a["ema"].items():
        torch.testing.assert_close(b["ema"][k], v, rtol=0, atol=0, msg=k)
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 9
    assert metric_rows(full_out) == metric_rows(tmp_path / "part")
    summary = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert summary["top1"] == full["top1"] and summary["epochs"] == 3


def test_outputs_of_a_run(data_dir, tmp_path):
    s = fit(config(data_dir, tmp_path / "run", keep="last"))
    out = tmp_path / "run"
    for f in (
        "metrics.jsonl",
        "summary.json",
        "curves.png",
        "confusion.png",
        "model/model.safetensors",
        "model/config.json",
        "last.pt",
    ):
        assert (out / f).is_file(), f
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert set(row) >= {"epoch", "step", "train_loss", "lr", "top1", "top5", "images_per_sec", "wall_s"}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {
        "top1",
        "top5",
        "best_top1",
        "epochs",
        "steps",
        "images_per_sec",
        "wall_s",
        "params",
        "model",
        "data",
    }
    assert summary["params"] == s["params"] > 0 and summary["data"]["classes"] == 3
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["class_names"] == ["class0", "class1", "class2"]
    from vitlab.data import channel_stats, load_data

    train = load_data(str(data_dir), cache_dir=str(tmp_path / "stats")).train
    assert (tuple(cfg["mean"]), tuple(cfg["std"])) == channel_stats(train.images, in_chans=3)  # the data's own
    assert cfg["extra"]["recipe"] == "small-data" and cfg["num_classes"] == 3
    import vitlab

    model = vitlab.load(out / "model")
    blob = load_state(out / "last.pt")
    ema = {k.removeprefix("module."): v for k, v in blob["ema"].items() if k.startswith("module.")}
    for k, v in model.state_dict().items():  # model/ holds the EMA weights when EMA is on
        torch.testing.assert_close(v, ema[k], msg=k)
