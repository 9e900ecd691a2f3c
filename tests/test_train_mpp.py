"""``--objective mpp``: masked patch prediction in the training loop, its resume, and fine-tuning from it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer
from vitlab.models.mpp import MaskedPatchPrediction
from vitlab.train import TrainConfig, fit, get_recipe
from vitlab.train.conf.rules import validate
from vitlab.train.engine.optim import param_groups
from vitlab.train.objectives import MPP, Classify
from vitlab.train.objectives.mpp import evaluate_mpp
from vitlab.train.persist.state import load_state
from vitlab.train.sizing.memory import mpp_bytes as step_bytes
from vitlab.train.sizing.recipe import mpp_recipe

TINY_ARCH = {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2, "mlp_ratio": 2}
TINY_FLAGS = ["--patch-size", "4", "--dim", "16", "--depth", "1", "--heads", "2", "--no-progress", "--workers", "0"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mppdata") / "rgb"
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 2)):
        for c in range(2):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 256, (4, 4, 3)).astype(np.uint8).repeat(4, 0).repeat(4, 1)  # flat 4x4 blocks
                Image.fromarray(arr).save(d / f"{i}.png")
    return root


def config(data_dir, out, **kw):
    recipe = get_recipe("mpp", epochs=2, batch_size=8, warmup_epochs=0, crop_scale=(1.0, 1.0), hflip=0.0)
    return TrainConfig(
        recipe=recipe,
        data=str(data_dir),
        out=str(out),
        arch=TINY_ARCH,
        objective="mpp",
        cache_dir=str(out.parent / "cache"),
        workers=0,
        progress=False,
        **kw,
    )


def test_no_weight_decay_covers_the_wrapper_and_the_vit() -> None:
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=0)
    net = MaskedPatchPrediction(vit)
    assert net.no_weight_decay() == {"mask_token", "model.pos_embed", "model.cls_token"}
    decay, no_decay = param_groups(net, 0.1)
    ids = {id(p) for p in no_decay["params"]}
    assert id(net.mask_token) in ids and id(vit.pos_embed) in ids and id(vit.cls_token) in ids
    assert id(net.mpp_head.weight) in {id(p) for p in decay["params"]}
    assert Classify.wrap(vit) is vit and MPP.exported(MPP.wrap(vit)) is vit
    with pytest.raises(ConfigError, match="objective"):
        validate(TrainConfig(objective="jigsaw"))


def test_evaluate_mpp_is_repeatable_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, num_classes=0)
    net = MaskedPatchPrediction(vit)
    batches = [(torch.rand(4, 3, 16, 16) * 2 - 1, torch.zeros(4, dtype=torch.long)) for _ in range(3)]
    before = torch.get_rng_state()
    a = evaluate_mpp(net, batches, device=torch.device("cpu"))
    b = evaluate_mpp(net, batches, device=torch.device("cpu"))
    assert torch.equal(before, torch.get_rng_state())
    assert a == b
    assert 0.35 * 192 < a["count"] < 0.65 * 192  # ~50% of 3 x 4 x 16 patches
    assert 0 <= a["top1"] <= a["top5"] <= 1
    assert abs(a["loss"] - math.log(512)) < 1.0  # an untrained head is near uniform over 512 colours


@pytest.mark.slow
def test_mpp_run_writes_a_headless_vit_and_colour_metrics(data_dir, tmp_path):
    out = tmp_path / "mpp"
    s = fit(config(data_dir, out, keep="last"))
    assert s["objective"] == "mpp" and s["steps"] == 4 and s["epochs"] == 2 and not s["interrupted"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    for r in rows:
        assert 0 <= r["top1"] <= r["top5"] <= 1
        assert 4.0 < r["train_loss"] < 8.0 and 4.0 < r["eval_loss"] < 8.0  # ln 512 = 6.24 at the start
    assert (out / "curves.png").is_file() and not (out / "confusion.png").exists()

    model = vitlab.load(out / "model")
    assert isinstance(model, VisionTransformer) and model.config.num_classes == 0
    assert model.config.extra["objective"] == "mpp"
    blob = load_state(out / "last.pt")
    assert {"mask_token", "mpp_head.weight", "mpp_head.bias"} <= set(blob["model"])
    saved = model.state_dict()
    assert set(saved) == {k.removeprefix("model.") for k in blob["model"] if k.startswith("model.")}
    for k, v in saved.items():
        torch.testing.assert_close(v, blob["model"][f"model.{k}"], rtol=0, atol=0, msg=k)
    feats = model(torch.zeros(1, 3, 16, 16))
    assert feats.shape == (1, 16)  # no head: pooled features


@pytest.mark.slow
def test_mpp_resume_matches_an_uninterrupted_run(data_dir, tmp_path):
    fit(config(data_dir, tmp_path / "full"))
    part = fit(config(data_dir, tmp_path / "part", stop_after=3))  # mid-epoch
    assert part["interrupted"] and part["steps"] == 3
    rest = fit(config(data_dir, tmp_path / "part"), resume=True)
    assert rest["steps"] == 4 and rest["objective"] == "mpp"
    a, b = load_state(tmp_path / "full" / "last.pt"), load_state(tmp_path / "part" / "last.pt")
    assert a["step"] == b["step"] == 4
    for k, v in a["model"].items():
        torch.testing.assert_close(b["model"][k], v, rtol=0, atol=0, msg=k)
    rows = [(tmp_path / d / "metrics.jsonl").read_text() for d in ("full", "part")]
    strip = [
        [{k: r[k] for k in ("step", "train_loss", "top1", "eval_loss")} for r in map(json.loads, t.splitlines())]
        for t in rows
    ]
    assert strip[0] == strip[1]


@pytest.mark.slow
def test_cli_mpp_then_finetune(data_dir, tmp_path, capsys):
    common = ["--data", str(data_dir), "--cache-dir", str(tmp_path / "cache"), *TINY_FLAGS]
    out = tmp_path / "cli_mpp"
    args = [
        "train",
        "--objective",
        "mpp",
        *common,
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--warmup-steps",
        "1",
        "--posemb",
        "sincos2d",
    ]
    args += ["--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "colour top-1" in text and "vitlab finetune --init" in text
    s = json.loads((out / "summary.json").read_text())
    assert s["objective"] == "mpp" and s["recipe"] == "mpp" and s["steps"] == 2

    ft = tmp_path / "ft"
    assert (
        main(
            ["finetune", "--init", str(out / "model"), *common, "--epochs", "1", "--batch-size", "8", "--out", str(ft)]
        )
        == 0
    )
    assert "top-1" in capsys.readouterr().out
    model = vitlab.load(ft / "model")
    cfg = model.config
    assert cfg.num_classes == 2 and cfg.class_names == ["class0", "class1"] and cfg.extra["init"] == str(out / "model")
    assert cfg.extra["objective"] == "classify"
    pre = vitlab.load(out / "model")
    assert pre.config.posemb == cfg.posemb == "sincos2d" and pre.config.num_classes == 0
    # the encoder started from the MPP weights (a fresh init differs by ~0.2): two SGD steps at a tiny LR
    # barely move them
    delta = (model.patch_embed.proj.weight - pre.patch_embed.proj.weight).abs().max().item()
    assert delta < 0.02


def test_cli_rejects_an_unknown_objective(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--objective", "jigsaw"])
    assert e.value.code == 2
    assert "--objective" in capsys.readouterr().err


def test_mpp_recipe_keeps_the_cifar_patch_and_what_the_user_gave() -> None:
    cfg = TrainConfig(recipe=get_recipe("mpp"), objective="mpp")
    assert mpp_recipe(cfg, n_train=50_000, image_size=(32, 32)) == (cfg.recipe, None)  # patch 4 at 32 px, batch 128
    at224, line = mpp_recipe(cfg, n_train=50_000, image_size=(224, 224))
    assert at224.arch["patch_size"] in (14, 16, 28, 32) and at224.batch_size == 128
    assert line.startswith("mpp: patch")
    given = TrainConfig(recipe=get_recipe("mpp"), objective="mpp", arch={"patch_size": 8})
    assert mpp_recipe(given, n_train=50_000, image_size=(224, 224)) == (given.recipe, None)  # the user's patch
    few, _ = mpp_recipe(cfg, n_train=40, image_size=(32, 32))
    assert few.batch_size == 8


def test_step_bytes_count_the_colour_head_on_every_patch() -> None:
    """What the MPP wrapper adds to a step (its share of the memory estimate): linear in the batch, and at least
    the 512-way logits, log-softmax and gradient of every patch (the loss weighs the corrupted ones)."""
    from vitlab.models import ViTConfig

    c = ViTConfig(name="x", img_size=64, patch_size=4, embed_dim=32, depth=1, num_heads=2, mlp_dim=64, num_classes=0)
    one, four = step_bytes(c, batch=1), step_bytes(c, batch=4)
    assert four == 4 * one
    assert one > 256 * 512 * 12
