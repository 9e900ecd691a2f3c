"""``--recipe auto`` (the rules, the printed line, summary.json, resume), the ``--time-budget`` re-plan's
schedule, and fine-tuning: layer-wise LR decay, ``--freeze``, the ``finetune`` recipe on a small folder."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

import vitlab
from imagefolder import tiny_folder
from vitlab.cli import main
from vitlab.train import TrainConfig, get_recipe
from vitlab.train.engine.optim import build_optimizer, layer_id
from vitlab.train.engine.schedule import lr_factor
from vitlab.train.sizing.recipe import (
    BUDGET_TOKEN_DROP,
    LEVELS,
    aug_level,
    auto_arch,
    auto_batch,
    auto_recipe,
    budget_token_drop,
    classify_recipe,
)

# n_train, epochs -> batch, steps, level, model
RULES = [
    (10_000, 5, 128, 390, "minimal", "tiny"),
    (10_000, 30, 128, 2340, "mild", "tiny"),  # one level lighter from 10k images
    (10_000, 60, 128, 4680, "light", "tiny"),
    (10_000, 15, 128, 1170, "mild", "tiny"),
    (1_000, 30, 32, 930, "light", "tiny"),
    (9_999, 15, 128, 1170, "light", "tiny"),
    (50_000, 26, 128, 10_140, "mild", "small"),
    (1_000, 100, 32, 3100, "strong", "tiny"),
    (160, 10, 8, 200, "light", "tiny"),
    (50_000, 100, 128, 39_000, "medium", "base"),
    (50_000, 300, 128, 117_000, "medium", "base"),
    (200_000, 60, 128, 93_720, "light", "base"),
    (2_000_000, 100, 128, 1_562_500, "light", "base"),  # two levels lighter for 1M+
    (2_000_000, 5, 128, 78_125, "minimal", "base"),
    (2_000_000, 30, 128, 468_750, "minimal", "base"),
    (2_000_000, 60, 128, 937_500, "mild", "base"),
]


@pytest.mark.parametrize(("n", "epochs", "batch", "steps", "level", "model"), RULES)
def test_auto_rules_table(n, epochs, batch, steps, level, model):
    r, line = auto_recipe(n_train=n, img_size=(32, 32), num_classes=10, epochs=epochs)
    assert r.name == "auto" and r.batch_size == batch and r.batch_size <= max(8, n // 16)
    assert f"{steps:,} steps" in line and f"-> {level} aug" in line and f"model {model} " in line
    aug = LEVELS[level]
    assert (r.crop_scale, r.randaugment, r.mixup, r.cutmix) == (
        aug["crop_scale"],
        aug["randaugment"],
        aug["mixup"],
        aug["cutmix"],
    )
    assert (r.random_erasing, r.drop_path) == (aug["random_erasing"], aug["drop_path"])
    assert (r.hflip, r.label_smoothing, r.weight_decay, r.optimizer) == (0.5, 0.1, 0.05, "adamw")
    assert r.warmup_steps == 0 and r.warmup_epochs == 0
    assert r.warmup_fraction == (0.1 if steps < 5000 else 0.05)
    assert r.scaled_lr(r.batch_size) == pytest.approx((2e-3 if epochs < 10 else 1e-3) * (batch / 128) ** 0.5)
    assert r.arch["patch_size"] == 4  # 32 px -> an 8 x 8 grid


def test_short_runs_do_not_crop():
    """Under 10 epochs the auto recipe's training transform keeps the whole image (flip aside), square or not;
    from the mild level on it crops (mild: squares only, light: any aspect ratio)."""
    from vitlab.data.pipeline.transforms import train_transform

    r, line = auto_recipe(n_train=10_000, img_size=(32, 32), num_classes=10, epochs=5)
    assert "no crop, flip" in line
    g = torch.Generator().manual_seed(0)
    for h, w in ((32, 32), (40, 32)):
        img = torch.rand(3, h, w, generator=g)
        t = train_transform(
            img_size=32, mean=(0, 0, 0), std=(1, 1, 1), crop_scale=r.crop_scale, crop_ratio=r.crop_ratio, hflip=0
        )
        for _ in range(5):
            out = t(img)
            top = (h - 32) // 2
            assert torch.equal(out, img[:, top : top + 32]), (h, w)  # a square image whole; else its centre
    mild, line = auto_recipe(n_train=10_000, img_size=(32, 32), num_classes=10, epochs=30)
    assert "-> mild aug" in line and "crop 0.8-1 square, flip" in line
    assert mild.crop_scale == (0.8, 1.0) and mild.crop_ratio == (1.0, 1.0) and mild.randaugment is None
    light, line = auto_recipe(n_train=1_000, img_size=(32, 32), num_classes=10, epochs=30)
    assert "crop 0.5-1" in line and light.crop_scale == (0.5, 1.0) and light.crop_ratio == (3 / 4, 4 / 3)


def test_auto_levels_grow_with_epochs_and_shrink_with_data():
    order = list(LEVELS)
    for n in (1_000, 10_000, 300_000, 3_000_000):
        levels = [order.index(aug_level(epochs=e, n_train=n)) for e in (1, 10, 30, 100, 300)]
        assert levels == sorted(levels)
    for e in (5, 30, 100, 300):
        levels = [order.index(aug_level(epochs=e, n_train=n)) for n in (1_000, 10_000, 100_000, 1_000_000)]
        assert levels == sorted(levels, reverse=True)
    assert (aug_level(epochs=5, n_train=1000), aug_level(epochs=300, n_train=1000)) == ("minimal", "strong")
    assert LEVELS["minimal"]["mixup"] == LEVELS["minimal"]["cutmix"] == 0 and LEVELS["minimal"]["randaugment"] is None


def test_auto_batch_and_model_for_the_budget():
    assert [auto_batch(n) for n in (5, 100, 160, 1_000, 1_437, 10_000, 1_000_000)] == [5, 8, 8, 32, 64, 128, 128]
    assert auto_batch(1_437, cap=512) == 64 and auto_batch(50_000, cap=512) == 512
    assert auto_arch(img_size=(64, 64), in_chans=3, time_budget=240)[0] == "tiny"  # 4 minutes on a CPU
    assert auto_arch(img_size=(64, 64), in_chans=3, time_budget=240)[1]["patch_size"] == 8
    assert auto_arch(img_size=(32, 32), in_chans=3, time_budget=3600, device_type="cuda")[0] == "base"
    assert auto_arch(img_size=(28, 28), in_chans=1, images_seen=50_000)[1]["patch_size"] == 4  # 7 x 7
    assert auto_arch(img_size=(224, 224), in_chans=3, images_seen=1e7)[1]["patch_size"] == 32  # 7 x 7
    r, line = auto_recipe(n_train=1_000, img_size=(64, 64), num_classes=10, time_budget=240)
    assert "estimated for 240 s on cpu" in line and r.batch_size == 32
    assert r.token_drop == 0.5 and "token drop 0.5 in training" in line  # a time budget buys ~2x the steps
    r2, _ = auto_recipe(n_train=1_000, img_size=(64, 64), num_classes=10, epochs=5, batch_size=16)
    assert r2.token_drop == 0.0  # a fixed number of epochs: dropping tokens only saves time
    assert r2.batch_size == 16 and r2.scaled_lr(16) == pytest.approx(2e-3 * (16 / 128) ** 0.5)


def test_a_budget_drops_tokens_on_the_grid_the_model_sees():
    """One rule for a fresh run and a fine-tune (before: the fresh run counted whole patches, the fine-tune the padded
    grid): half the tokens from a grid of 16, partial patches counted, since the model pads a side the patch does
    not divide."""
    assert budget_token_drop((32, 32), 8) == BUDGET_TOKEN_DROP  # 4 x 4
    assert budget_token_drop((24, 24), 8) == 0.0  # 3 x 3: too few tokens to drop half
    assert budget_token_drop((30, 30), 8) == BUDGET_TOKEN_DROP  # padded to 32: 4 x 4, as the model sees it
    assert budget_token_drop((30, 90), 16) == 0.0  # 2 x 6


def test_a_time_budget_on_small_images_trains_with_muon_photos_and_epochs_with_adamw():
    """Muon won the CIFAR-10 speedrun and the auto recipe's 5-minute rows (docs/training.md): a time budget on small
    images takes it, photos (chosen at 224 px or cropped from larger files) and a fixed number of epochs keep AdamW,
    and where Muon cannot go (--fsdp, layer-wise LR decay, --freeze) the fitted recipe falls back to AdamW and says
    so; an --optimizer the user gave is kept."""
    r, line = auto_recipe(n_train=50_000, img_size=(32, 32), num_classes=10, time_budget=300)
    assert r.optimizer == "muon" and "Muon (encoder matrices) + AdamW lr" in line
    for kw in ({"epochs": 5}, {"time_budget": 300, "photo_data": True}, {"time_budget": 300, "photos": True}):
        r, line = auto_recipe(n_train=1_000, img_size=(64, 64), num_classes=10, **kw)
        assert r.optimizer == "adamw" and "AdamW lr" in line and "Muon" not in line

    def fitted(**kw):
        given = [k for k in ("optimizer", "layer_decay") if k in kw]
        recipe = get_recipe("auto", **{k: kw.pop(k) for k in given})
        cfg = TrainConfig(recipe=recipe, data="unused", out="unused", time_budget=300, recipe_given=given, **kw)
        recipe, line = classify_recipe(cfg, n_train=10_000, image_size=(32, 32), num_classes=10, in_chans=3,
                                       device_type="cpu")  # fmt: skip
        return recipe.optimizer, "Muon" in line

    assert fitted() == ("muon", True)
    assert fitted(optimizer="sgd") == ("sgd", False)
    assert fitted(fsdp=True) == fitted(layer_decay=0.75) == ("adamw", False)


def _train(args, tmp_path, capsys):
    code = main([*args, "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--workers", "0"])
    return code, capsys.readouterr().out


@pytest.mark.slow
def test_auto_is_the_default_for_a_folder_prints_its_choice_and_resumes_it(tmp_path, capsys, monkeypatch):
    from vitlab.train.sizing import recipe as auto

    data = tiny_folder(tmp_path / "data", per_class=16, size=16)
    out = tmp_path / "run"
    base = ["train", "--data", str(data), "--out", str(out), "--epochs", "2"]
    code, text = _train([*base, "--mixup", "0.4", "--stop-after", "3"], tmp_path, capsys)
    assert code == 0
    line = next(ln for ln in text.splitlines() if ln.startswith("auto: "))
    assert "12 steps (2 epochs of 6) on 48 images" in line and "-> minimal aug" in line and "batch 8" in line
    assert "kept as given: mixup" in line
    s = json.loads((out / "summary.json").read_text())
    assert s["recipe"] == "auto" and s["recipe_chosen"] == line
    rc = s["recipe_config"]
    assert (rc["batch_size"], rc["mixup"], rc["randaugment"], rc["warmup_fraction"]) == (8, 0.4, None, 0.1)
    assert rc["arch"] == {"patch_size": 2, "embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_dim": 256, **auto.PLAIN}

    def refit(**_):
        raise AssertionError("a resumed run must keep its recipe, not fit a new one")

    monkeypatch.setattr(auto, "auto_recipe", refit)
    code, text = _train(["train", "--out", str(out), "--resume"], tmp_path, capsys)
    assert code == 0 and "auto: " not in text
    s2 = json.loads((out / "summary.json").read_text())
    assert s2["recipe_config"] == rc and s2["recipe_chosen"] == line and s2["steps"] == 12
    model = json.loads((out / "model" / "config.json").read_text())
    assert (model["posemb"], model["pool"], model["class_token"]) == ("sincos2d", "cls", True)


def test_named_recipes_win_and_digits_keeps_its_recipe(tmp_path, capsys):
    from vitlab.train import fit  # noqa: F401  (the CLI's own path)
    from vitlab.train.conf.parser import config_from_args

    parser = _parser()
    cfg = config_from_args(parser.parse_args(["train", "--data", "some/folder"]))
    assert cfg.recipe.name == "auto"
    cfg = config_from_args(parser.parse_args(["train", "--data", "some/folder", "--recipe", "small-data"]))
    assert cfg.recipe.name == "small-data" and cfg.recipe.mixup == 0.8
    assert config_from_args(parser.parse_args(["train"])).recipe.name == "digits"
    cfg = config_from_args(parser.parse_args(["train", "--data", "f", "--batch-size", "16", "--randaugment", "none"]))
    assert cfg.recipe_given == ["batch_size", "randaugment"]


def _parser():
    import argparse

    from vitlab.commands import train as train_cmd

    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    train_cmd.add_parser(sub, argparse.HelpFormatter)
    return p


@pytest.mark.slow
def test_time_budget_re_plan_refits_the_warmup_so_the_run_ends_annealed(tmp_path, monkeypatch, step_lrs):
    """A probe far too optimistic plans 100k steps, a warmup of 10k; the run's own pace (faked, so that the
    test does not depend on the machine's load) re-plans to 120. The warmup is re-fitted with the cosine:
    the LR peaks early and decays over the run's end."""
    from vitlab import train as trainer
    from vitlab.train.sizing import budget

    monkeypatch.setattr("vitlab.train.sizing.budget.measure_budget", lambda *a, **k: (100_000, 5_000, 0.0, 0.05, 0.5))

    def measured(self, *, steps_this_run, **_):  # the run's own pace, without a real clock: 120 steps fit
        return (120, 0.05) if self.due and steps_this_run == budget.REPLAN_AT else None

    monkeypatch.setattr(budget.Replanner, "after_step", measured)
    lrs = step_lrs
    cfg = trainer.TrainConfig(
        recipe=get_recipe("digits", batch_size=32, warmup_steps=10_000),
        arch={"embed_dim": 16, "depth": 1, "num_heads": 2},
        out=str(tmp_path / "run"),
        time_budget=6.0,
        workers=0,
        progress=False,
    )
    s = trainer.fit(cfg)
    n = s["steps"]
    assert n == 120 and len(lrs) == n
    peak = max(lrs)
    assert lrs.index(peak) <= n // 2 + 1  # warmup capped at half the re-planned run, not the planned one
    tail = lrs[-max(3, n // 4) :]
    assert all(b < a for a, b in itertools.pairwise(tail))  # decaying over the last quarter
    assert lrs[-1] < 0.05 * peak
    plan = torch.load(tmp_path / "run" / "last.pt", weights_only=False)["plan"]
    assert plan["warmup_steps"] == plan["total_steps"] // 2


def test_warmup_fraction_follows_the_re_planned_length():
    from vitlab.train.conf.phases import warmup_for

    r = get_recipe("auto", warmup_fraction=0.1)
    assert warmup_for(r, total_steps=514, steps_per_epoch=50) == (51, 51)
    assert warmup_for(r, total_steps=272, steps_per_epoch=50) == (27, 27)
    fixed = get_recipe("small-data")  # 10 warmup epochs: capped at half the run
    assert warmup_for(fixed, total_steps=272, steps_per_epoch=50) == (136, 500)
    assert lr_factor(271, total_steps=272, warmup_steps=27) < 0.001


def test_layer_decay_sets_the_documented_lr_per_block():
    depth, decay, lr = 3, 0.5, 1e-3
    m = vitlab.create_model("vit_ti16", img_size=32, depth=depth, num_classes=4)
    opt = build_optimizer(m, get_recipe("finetune", layer_decay=decay, weight_decay=0.05), lr)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in m.named_parameters():
        i = layer_id(name, depth)
        if name.startswith("blocks."):
            block = int(name.split(".")[1])
            assert i == block + 1
            assert lr_of[id(p)] == pytest.approx(lr * decay ** (depth - block), rel=1e-12), name
        elif name.startswith(("head.", "norm.")):
            assert lr_of[id(p)] == pytest.approx(lr, rel=1e-12), name
        else:  # patch embedding, class token, position embeddings: the lowest
            assert name.split(".")[0] in ("cls_token", "pos_embed", "patch_embed"), name
            assert lr_of[id(p)] == pytest.approx(lr * decay ** (depth + 1), rel=1e-12), name
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(m.parameters()))
    no_decay = [g for g in opt.param_groups if g["weight_decay"] == 0.0]
    assert all(p.ndim <= 1 or n in ("cls_token", "pos_embed") for g in no_decay for n, p in _named(m, g))
    plain = build_optimizer(m, get_recipe("finetune", weight_decay=0.05), lr)
    assert all(g["lr"] == lr for g in plain.param_groups) and len(plain.param_groups) == 2


def _named(m, group):
    ids = {id(p) for p in group["params"]}
    return [(n, p) for n, p in m.named_parameters() if id(p) in ids]


def _init_model(tmp_path, classes=3):
    m = vitlab.create_model("vit_ti16", img_size=8, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    vitlab.save(m, tmp_path / "init")
    return vitlab.load(tmp_path / "init")


@pytest.mark.slow
def test_freeze_trains_only_the_head(tmp_path, capsys):
    init = _init_model(tmp_path)
    data = tiny_folder(tmp_path / "data", per_class=16, size=8)
    out = tmp_path / "ft"
    args = ["finetune", "--init", str(tmp_path / "init"), "--data", str(data), "--out", str(out)]
    code, _ = _train([*args, "--epochs", "2", "--linear-probe", "--keep", "last", "--lr", "0.3"], tmp_path, capsys)
    assert code == 0
    after = vitlab.load(out / "model")
    before = dict(init.named_parameters())
    changed = []
    for name, p in after.named_parameters():
        if name.startswith("head."):
            changed.append(not torch.equal(p, before[name]))
        else:
            assert torch.equal(p, before[name]), name  # bit-identical
    assert any(changed)  # the head did train
    assert json.loads((out / "summary.json").read_text())["recipe_config"]["freeze"] is True


@pytest.mark.slow
def test_finetune_recipe_scales_to_a_160_image_folder(tmp_path, capsys):
    _init_model(tmp_path)
    data = tiny_folder(tmp_path / "data", per_class=54, size=8)  # 162 training images
    out = tmp_path / "ft"
    args = ["finetune", "--init", str(tmp_path / "init"), "--data", str(data), "--out", str(out), "--epochs", "1"]
    args += ["--recipe", "finetune"]  # the paper's recipe (the default fits auto: test_finetune_defaults.py)
    code, text = _train([*args, "--stop-after", "2"], tmp_path, capsys)
    assert code == 0 and "finetune on 162 images: batch 8" in text
    rc = json.loads((out / "summary.json").read_text())["recipe_config"]
    assert (rc["batch_size"], rc["warmup_steps"], rc["warmup_fraction"], rc["optimizer"]) == (8, 0, 0.05, "sgd")
    assert get_recipe("finetune").scaled_lr(8) == pytest.approx(0.03 * 8 / 512)  # a named recipe: linear
    assert (rc["lr"], rc["base_batch"]) == (pytest.approx(0.03 * (8 / 512) ** 0.5), 8)  # fitted: square root
    assert "lr 0.0037 (0.03 at batch 512, scaled by the square root of the batch)" in text
    # a batch the user asks for is kept (and still refused when larger than the data)
    code = main([*args, "--overwrite", "--batch-size", "512", "--cache-dir", str(tmp_path / "cache"), "--no-progress"])
    assert code == 2 and "--batch-size 512 is larger than the training set" in capsys.readouterr().err


def _head_warmup_run(tmp_path, *options):
    """``(the --init model's parameters, the run folder, vitlab finetune's arguments)`` for a head warm-up on 48
    images (batch 8, 6 steps an epoch), AdamW at LR 0.3, with ``options``."""
    init = _init_model(tmp_path)
    before = {n: p.detach().clone() for n, p in init.named_parameters()}
    data = tiny_folder(tmp_path / "data", per_class=16, size=8)
    out = tmp_path / "ft"
    args = ["finetune", "--init", str(tmp_path / "init"), "--data", str(data), "--out", str(out), "--lr", "0.3"]
    return before, out, [*args, "--optimizer", "adamw", *options]


@pytest.mark.slow
def test_head_warmup_holds_the_body_back_then_trains_everything(tmp_path, capsys):
    options = ["--epochs", "2", "--head-warmup", "3", "--keep", "last", "--weight-decay", "0.1"]
    options += ["--tune", "full"]  # (what it trains stated: issue 60's rule is tested apart)
    before, out, args = _head_warmup_run(tmp_path, *options)
    code, text = _train([*args, "--stop-after", "3"], tmp_path, capsys)  # stops at the end of the head-only steps
    assert code == 0 and "head warmup done after 3 steps" in text
    held = torch.load(out / "last.pt", map_location="cpu", weights_only=False)["model"]
    for name, p in before.items():
        if name.startswith("head."):
            assert not torch.equal(held[name], p), name  # the head trained
        else:
            assert torch.equal(held[name], p), name  # bit-identical, weight decay included
    code, text = _train([*args[:3], "--out", str(out), "--resume"], tmp_path, capsys)
    assert code == 0 and "head warmup done" not in text
    after = dict(vitlab.load(out / "model").named_parameters())
    assert all(not torch.equal(after[n], p) for n, p in before.items() if "blocks.0." in n or n == "pos_embed")
    rc = json.loads((out / "summary.json").read_text())["recipe_config"]
    assert rc["head_warmup"] == 3


@pytest.mark.slow
def test_head_warmup_under_lora_says_it_releases_the_adapters_and_trains_no_base_weight(tmp_path, capsys):
    before, out, args = _head_warmup_run(tmp_path, "--epochs", "1", "--head-warmup", "1", "--tune", "lora")
    code, text = _train([*args, "--stop-after", "4"], tmp_path, capsys)
    assert code == 0 and "the new head trains alone for 1 step first" in text  # (the auto line: "1 steps" before)
    assert "head warmup done after 1 step: training low-rank adapters and the head from here" in text
    assert "every weight" not in text  # (it said so before, while only the adapters were released)
    held = torch.load(out / "last.pt", map_location="cpu", weights_only=False)["model"]
    trained = [k for k in held if "lora_B" in k and held[k].abs().sum() > 0]
    assert trained  # the adapters trained after the warm-up (lora_B starts at zero)
    for name, p in before.items():
        base = name.replace("weight", "base_layer.weight").replace("bias", "base_layer.bias")
        if not name.startswith("head."):
            assert torch.equal(held[base if base in held else name], p), name  # no base weight moved


def test_head_warmup_and_freeze_exclude_each_other(tmp_path, capsys):
    _init_model(tmp_path)
    data = tiny_folder(tmp_path / "data", per_class=4, size=8)
    args = ["finetune", "--init", str(tmp_path / "init"), "--data", str(data), "--out", str(tmp_path / "ft")]
    code = main([*args, "--freeze", "--head-warmup", "2", "--cache-dir", str(tmp_path / "cache")])
    assert code == 2 and "--freeze already trains only the head" in capsys.readouterr().err


@pytest.mark.slow
def test_auto_model_layout_yields_to_the_users_flags(tmp_path, capsys):
    """``--pool gap`` / ``--posemb learn`` on the command line win over the layout auto picks."""
    data = tiny_folder(tmp_path / "data", per_class=8, size=16)
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--epochs", "1", "--pool", "gap", "--posemb", "learn"]
    code, _ = _train(args, tmp_path, capsys)
    assert code == 0
    model = json.loads((out / "model" / "config.json").read_text())
    assert (model["posemb"], model["pool"], model["class_token"]) == ("learn", "gap", False)


@pytest.mark.slow
@pytest.mark.parametrize("flags, rate", [([], 0.5), (["--token-drop", "0"], 0.0)])
def test_auto_drops_tokens_for_a_time_budget_unless_told_not_to(tmp_path, capsys, flags, rate):
    data = tiny_folder(tmp_path / "data", per_class=8, size=16)
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--time-budget", "3s", *flags]
    code, text = _train(args, tmp_path, capsys)
    assert code == 0
    assert json.loads((out / "model" / "config.json").read_text())["patch_drop_rate"] == rate
    assert ("token drop 0.5 in training" in text) == (rate > 0)
    assert "Muon (encoder matrices) + AdamW lr" in text


def test_patch_rule_photos_get_16_and_odd_sides_are_padded_never_patch_1():
    """Photos (from 160 px) get the paper's patch 16; small sizes keep the 8 x 8 grid rule (CIFAR 32 -> 4, digits
    8 -> 1, MNIST 28 -> 4, 64 -> 8); sides that no grid-friendly patch divides are padded (dynamic_img_pad)
    instead of cut into 1-px patches (75 x 100 was 7,500 tokens)."""
    assert auto_arch(img_size=(224, 224), in_chans=3, images_seen=1e4, photos=True)[1]["patch_size"] == 16
    for side, patch in ((32, 4), (8, 1), (28, 4), (64, 8)):
        _, arch = auto_arch(img_size=(side, side), in_chans=3, images_seen=1e4)
        assert arch["patch_size"] == patch and "dynamic_img_pad" not in arch
    _, odd = auto_arch(img_size=(75, 100), in_chans=3, images_seen=1e4)
    assert (odd["patch_size"], odd["dynamic_img_pad"]) == (8, True)
    _, hd = auto_arch(img_size=(1080, 1080), in_chans=3, images_seen=1e4, photos=True)  # a size given as is
    assert (hd["patch_size"], hd["dynamic_img_pad"]) == (16, True)


@pytest.mark.slow
def test_a_folder_of_odd_sized_images_trains_with_padded_patches(tmp_path, capsys):
    data = tiny_folder(tmp_path / "data", per_class=8, size=30)  # 30 = 2 x 3 x 5: only patches 2 and 1 divide it
    out = tmp_path / "run"
    code, text = _train(["train", "--data", str(data), "--out", str(out), "--epochs", "1"], tmp_path, capsys)
    assert code == 0 and "model tiny (patch 4, padded," in text and "30x30 px, patch 4" in text
    assert json.loads((out / "model" / "config.json").read_text())["dynamic_img_pad"] is True
