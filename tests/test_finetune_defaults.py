"""``vitlab finetune`` with its defaults (issue 36): the pre-trained head is kept only for the same classes in the same
order, and the default recipe is a fitting of its own (``auto`` with ``--init``: AdamW at an LR for the model's width,
the time budget's token dropping and augmentation, LP-FT on small data), the paper's SGD recipe a name away."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import vitlab
from vitlab.cli import main
from vitlab.models import ViTConfig
from vitlab.train.conf.arch import head_choice
from vitlab.train.conf.train_config import build_config
from vitlab.train.engine.model import InitModel
from vitlab.train.persist.advice import advice_line
from vitlab.train.sizing.finetune import (
    AUTO_LORA_RANK,
    FT_BATCH,
    FT_LR,
    FULL_FROM,
    SMALL_DATA,
    finetune_lr,
    finetune_recipe,
    given_method_advice,
    method_advice,
    tune_method,
)
from vitlab.train.sizing.recipe import BUDGET_TOKEN_DROP, LEVELS, aug_level

NAMES = ["cat", "dog", "fox", "owl"]


def _init(tmp_path: Path, names=NAMES, img: int = 16) -> Path:
    m = vitlab.create_model(
        "vit_ti16", img_size=img, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=len(names)
    )
    with torch.no_grad():
        m.head.weight.normal_()  # a trained head: not zero
    m.config.class_names = list(names)
    vitlab.save(m, tmp_path / "init")
    return tmp_path / "init"


def _folder(root: Path, names, *, per_class: int = 8, size: int = 16) -> Path:
    """``root/<name>/NN.png`` (no val/: the run holds out 10%); class i has a bright channel i % 3."""
    rng = np.random.default_rng(0)
    for i, name in enumerate(names):
        d = root / name
        d.mkdir(parents=True)
        for k in range(per_class):
            arr = rng.integers(0, 80, (size, size, 3)).astype(np.uint8)
            arr[..., i % 3] += 150
            Image.fromarray(arr).save(d / f"{k:02d}.png")
    return root


# -- the head ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "flag", "kept", "words"),
    [
        (NAMES, False, True, "head kept: the same 4 classes in the same order"),
        (["ant", "bee", "cow", "elk"], False, False, "other classes: the model's are cat, dog, fox, owl"),
        (["dog", "cat", "fox", "owl"], False, False, "the same classes in another order"),
        (NAMES, True, False, "(--new-head)"),
    ],
)
def test_the_head_is_kept_only_for_the_same_names_in_the_same_order(tmp_path, names, flag, kept, words):
    """Before: a head with the right number of outputs was kept whatever its classes were ("head kept (4 classes)"),
    its old classes relabelled with the new names."""
    init = _init(tmp_path)
    cfg = dataclasses.replace(build_config({"init": str(init), "data": "unused"}), new_head=flag)
    model, line = InitModel.read(cfg).build(cfg, cfg.recipe, num_classes=4, class_names=names)
    before = vitlab.load(init)
    assert words in line, line
    if kept:
        assert torch.equal(model.head.weight, before.head.weight) and torch.equal(model.head.bias, before.head.bias)
    else:
        assert "head replaced by a zero-initialised one for 4 classes" in line
        assert not model.head.weight.any() and not model.head.bias.any()
    assert model.config.class_names == names
    assert torch.equal(model.blocks[0].attn.qkv.weight, before.blocks[0].attn.qkv.weight)  # the body is kept


def test_heads_names_the_head_count_a_bare_state_dict_cannot_tell(tmp_path):
    """A timm-named state dict of a width outside the paper's table does not say its head count (``qkv`` is 3D x D for
    any). Before: ``--init`` read it with one head (a warning said "pass num_heads=...", which no flag could) and
    ``--heads 2`` was refused as not matching that guess. Now ``--heads`` says it, as convert's ``--num-heads``."""
    from safetensors.torch import save_file

    from vitlab.train.conf.options import OptionError

    torch.manual_seed(0)
    ref = vitlab.create_model("vit_ti16", img_size=16, patch_size=4, embed_dim=48, depth=1, num_heads=2,
                              num_classes=0).eval()  # fmt: skip
    bare = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, bare)
    cfg = build_config({"init": str(bare), "data": "unused", "arch.num_heads": 2, "recipe.token_drop": 0.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no guess to warn of
        init = InitModel.read(cfg)
    assert init.config.num_heads == 2
    model, _ = init.build(cfg, cfg.recipe, num_classes=4, class_names=NAMES)
    x = torch.randn(2, 3, 16, 16)
    assert torch.allclose(model.eval().forward_features(x), ref.forward_features(x), rtol=1e-4, atol=1e-5)
    folder = _init(tmp_path)  # a vitlab folder states its 2 heads: a flag that contradicts them is still refused
    with pytest.raises(OptionError, match="does not match"):
        InitModel.read(build_config({"init": str(folder), "data": "unused", "arch.num_heads": 4}))


def test_a_head_count_guess_points_each_command_to_the_flag_that_states_it(tmp_path):
    """Before: the guess's warning said "on the command line: --heads" to every command, and under ``vitlab train
    --teacher FILE`` that flag sets the student's heads, not the teacher's. Now it names what states the file's count
    for any command (``vitlab convert --num-heads``), and the model it writes loads with that count and no guess."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = vitlab.create_model("vit_ti16", img_size=16, patch_size=4, embed_dim=48, depth=1, num_heads=2,
                              num_classes=3).eval()  # fmt: skip
    bare = tmp_path / "bare.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, bare)
    with pytest.warns(UserWarning, match="assuming 1 attention head") as caught:
        guessed = vitlab.load(bare)
    text = next(str(w.message) for w in caught if "assuming" in str(w.message))
    assert "vitlab convert FILE DST --num-heads N" in text and "vitlab finetune --init FILE` takes --heads" in text
    assert guessed.config.num_heads == 1
    assert main(["convert", str(bare), str(tmp_path / "stated"), "--num-heads", "2"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the written model states its heads: nothing to guess
        stated = vitlab.resolve_model(str(tmp_path / "stated"), trained=True, option="--teacher")
    x = torch.randn(2, 3, 16, 16)
    assert torch.allclose(stated.forward_features(x), ref.forward_features(x), rtol=1e-4, atol=1e-5)


def test_head_choice_reasons():
    cfg = ViTConfig(num_classes=3, class_names=None)
    assert head_choice(cfg, ["a", "b", "c"]) == (
        True,
        "the model names no classes, so its 3 outputs cannot be matched to these",
    )
    assert head_choice(ViTConfig(num_classes=0), ["a"])[0] and head_choice(ViTConfig(head="mlp"), ["a"])[0]


# -- the fitting ---------------------------------------------------------------------------------------------------


def _fit(n_train=1000, *, width=96, img=32, patch=4, names=None, flags=None, budget=None, processes=1, pace=None,
         **given):  # fmt: skip
    init = ViTConfig(img_size=(img, img), patch_size=patch, embed_dim=width, depth=4, num_heads=3, mlp_dim=2 * width,
                     num_classes=10, class_names=[f"c{i}" for i in range(10)])  # fmt: skip
    values = {"init": "pre/model", "data": "unused", "time_budget": budget, **(flags or {})}
    values.update({f"recipe.{k}": v for k, v in given.items()})
    cfg = build_config(values, given={f"recipe.{k}" for k in given})
    assert cfg.recipe.name == "auto"  # --init without --recipe: the fine-tuning fitting
    names = names or [f"n{i}" for i in range(10)]
    recipe, line = finetune_recipe(cfg, n_train=n_train, class_names=names, in_chans=3, device_type="cpu", init=init,
                                   processes=processes, pace=pace)  # fmt: skip
    return SimpleNamespace(recipe=recipe, resolved=line)  # what the rule chose, and the line that says so


def test_the_default_fits_adamw_at_the_measured_lr_scaled_by_width_and_batch():
    """Before: SGD at 0.03 * sqrt(batch / 512) (0.0075 at batch 32), the same for every model."""
    cfg = _fit(1000)
    r = cfg.recipe
    assert (r.optimizer, r.batch_size, r.weight_decay, r.clip_grad) == ("adamw", 32, 0.05, 1.0)
    assert r.scaled_lr(r.batch_size) == pytest.approx(FT_LR * (32 / FT_BATCH) ** 0.5)
    assert r.epochs == 30 and r.warmup_fraction == 0.1 and r.token_drop == 0.0  # no budget: no token dropping
    level = aug_level(epochs=30, n_train=1000)
    assert r.crop_scale == LEVELS[level]["crop_scale"] and r.randaugment == LEVELS[level]["randaugment"]
    assert (
        cfg.resolved.startswith("auto (fine-tuning pre/model: width 96, depth 4") and f"-> {level} aug" in cfg.resolved
    )
    wide = _fit(1000, width=768).recipe
    assert wide.lr == pytest.approx(finetune_lr(width=768, batch=32)) == pytest.approx(r.lr / 8)
    assert _fit(1000, lr=0.01, optimizer="sgd").recipe.lr == 0.01  # the user's flags are kept
    assert "kept as given: lr, optimizer" in _fit(1000, lr=0.01, optimizer="sgd").resolved


def test_lp_ft_for_a_new_head_on_small_data_only():
    r = _fit(1000).recipe
    assert 1 <= r.head_warmup <= 1000 // 32  # at most one epoch, half the warmup
    assert r.head_warmup == min(1000 // 32, round(0.1 / 2 * 30 * (1000 // 32)))  # half the 10% warmup, capped
    assert _fit(1000, names=[f"c{i}" for i in range(10)]).recipe.head_warmup == 0  # the head is kept
    assert _fit(SMALL_DATA).recipe.head_warmup == 0  # enough data
    assert _fit(1000, processes=2).recipe.head_warmup == 0  # the head-only phase runs in one process
    assert _fit(1000, freeze=True).recipe.head_warmup == 0  # a linear probe trains the head only anyway
    assert "trains alone for" in _fit(1000).resolved


def _params(width: int = 96) -> int:
    return ViTConfig(
        img_size=(32, 32), patch_size=4, embed_dim=width, depth=4, num_heads=3, mlp_dim=2 * width, num_classes=10
    ).num_params()  # fmt: skip  (_fit's --init model)


@pytest.mark.parametrize("width", [96, 768])
def test_the_method_is_picked_by_the_data_and_the_model_size(width):
    """Issue 60: LoRA (rank 4) under FULL_FROM images a parameter, every weight from there (docs/transfer.md's
    table, measured again with the budget's passes counted from the pace: the head alone, picked under 300 images
    before, led nowhere); the first line says which and why; a wider model keeps LoRA on more images."""
    full_from = math.ceil(FULL_FROM * _params(width))
    sizes = {"lora": [1, full_from - 1], "full": [full_from, 10 * full_from]}
    for method, ns in sizes.items():
        for n in ns:
            fit = _fit(n, width=width)
            assert fit.recipe.tuning == method, (n, width)
            assert f"; method {method}: " in fit.resolved and "(docs/transfer.md)" in fit.resolved
            assert fit.recipe.lora_rank == AUTO_LORA_RANK if method == "lora" else fit.recipe.lora == 0
            assert (fit.recipe.head_warmup == 0) == (n >= SMALL_DATA)  # LP-FT under 10,000 images
    assert full_from > 50 * math.ceil(FULL_FROM * _params(96)) if width == 768 else full_from < 100


def test_a_method_given_is_kept_and_judged_by_the_same_rule():
    """--tune, --lora and --freeze choose the method themselves; the end-of-run advice names the rule's pick when they
    differ (and says nothing when they agree), so a fine-tune is never told to undo what the rule chose; --fsdp holds
    no adapters, so the rule picks full fine-tuning there instead of LoRA."""
    assert _fit(100, tune="full").recipe.tuning == "full" and "; method " not in _fit(100, tune="full").resolved
    assert _fit(100, lora=8).recipe.lora_rank == 8 and _fit(100, freeze=True).recipe.tuning == "head"
    p = _params()
    few = math.ceil(FULL_FROM * p) - 1  # LoRA's images
    finding, fix = method_advice("head", n_train=100, params=p)
    assert "--tune head where the fine-tune rule picks full (" in finding and fix == "--tune full"
    assert method_advice("full", n_train=100, params=p) is None and method_advice("bias", n_train=100, params=p) is None
    assert method_advice("full", n_train=few, params=p)[1] == f"--lora {AUTO_LORA_RANK}"
    assert tune_method(n_train=few, params=p, fsdp=True)[0] == "full"
    assert method_advice("full", n_train=few, params=p, muon=True) is None  # the rule picks full under Muon too
    assert _fit(few).recipe.tuning == "lora"
    assert _fit(few, optimizer="muon").recipe.tuning == "full"  # Muon updates whole matrices
    assert _fit(few, flags={"fsdp": True}).recipe.tuning == "full"
    rows = [{"epoch": i, "top1": 0.5, "eval_loss": 1.0, "train_loss": 1.0} for i in range(1, 5)]
    line = advice_line(rows, recipe=_fit(100).recipe, epochs=4, method=(finding, fix))
    assert line == f"advice: {finding}: try --tune full"
    assert advice_line(rows[:1], recipe=_fit(100).recipe, epochs=1, method=(finding, fix)) == line  # any length
    assert advice_line(rows, recipe=_fit(100).recipe, epochs=4) is None


def test_the_end_of_run_judges_a_given_method_with_the_runs_own_settings():
    """The advice reads the run's config as the pick does: a method the rule picked is never judged; a method given is
    judged with the run's --optimizer muon and --fsdp (so the fix is one those flags allow); a run without --init is
    no fine-tune."""
    p = _params()
    few = math.ceil(FULL_FROM * p) - 1  # LoRA's images

    def cfg(**given):
        values = {"init": "pre/model", "data": "unused", **{f"recipe.{k}": v for k, v in given.items()}}
        return build_config(values, given={f"recipe.{k}" for k in given})

    assert given_method_advice(cfg(), "lora", n_train=few, params=p) is None  # the rule's own pick
    assert given_method_advice(cfg(tune="full"), "full", n_train=few, params=p)[1] == "--lora 4"
    assert given_method_advice(cfg(tune="head"), "head", n_train=100, params=p)[1] == "--tune full"
    assert given_method_advice(cfg(tune="full", optimizer="muon"), "full", n_train=few, params=p) is None
    fsdp = build_config(
        {"init": "pre/model", "data": "unused", "fsdp": True, "recipe.tune": "full"}, given={"recipe.tune"}
    )
    assert given_method_advice(fsdp, "full", n_train=few, params=p) is None  # no adapters under --fsdp: full agrees
    assert given_method_advice(cfg(lora=8), "lora", n_train=10_000, params=p)[1] == "--tune full"
    no_init = build_config({"data": "unused", "recipe.tune": "full"}, given={"recipe.tune"})
    assert given_method_advice(no_init, "full", n_train=100, params=p) is None


@pytest.mark.parametrize(("img", "patch", "drop"), [(32, 4, BUDGET_TOKEN_DROP), (16, 8, 0.0)])
def test_a_time_budget_drops_tokens_and_fits_the_augmentation_to_its_passes(img, patch, drop):
    """Before: a budgeted fine-tune trained on every token (half the steps of `vitlab train`'s budget)."""
    cfg = _fit(1000, img=img, patch=patch, budget=300.0)
    r = cfg.recipe
    assert r.token_drop == drop  # a grid of 64 tokens drops half; one of 4 tokens none
    assert "estimated for 300 s on cpu" in cfg.resolved
    passes = float(cfg.resolved.split(" passes -> ")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert f"-> {aug_level(epochs=passes, n_train=1000, finetune=True)} aug" in cfg.resolved
    assert _fit(1000, budget=300.0, token_drop=0.0).recipe.token_drop == 0.0


def test_a_time_budget_counts_a_fine_tunes_passes_from_the_measured_pace():
    """Before: a fine-tune's passes (its augmentation, LP-FT's warm-up, the line's steps) were estimated at a fixed
    1e10 multiply-accumulates a second, while a fresh run's came from the pace a probe measured (issue 57: one sizing
    rule on the same measurements). Now the probe's pace counts them as the plan will (paced_level): the --init
    model's step scaled by its multiply-accumulates and what trains (STEP_FORWARDS), with each epoch's ends.
    Without a probe the estimate counts the step's work by what trains too (before: 3 forwards for every method)."""
    from vitlab.train.sizing.pace import STEP_FORWARDS, Pace, save_seconds, steps_in_budget
    from vitlab.train.sizing.recipe import forward_macs

    pace = Pace(step_s=0.05, step_macs=1e9, batch=32, aug_s={k: 1e-4 for k in LEVELS}, eval_s=0.5,
                eval_image_macs=1e6, n_eval=200, elapsed_s=2.0, probe="the probe")  # fmt: skip
    arch = {"patch_size": 4, "embed_dim": 96, "depth": 4, "mlp_dim": 192}
    params = ViTConfig(img_size=(32, 32), **arch, num_heads=3, num_classes=10).num_params()
    for n_train, given in ((100, {"tune": "head"}), (400, {"lora": 4}), (3000, {})):
        fit = _fit(n_train, budget=300.0, pace=pace, **given)
        r = fit.recipe
        tune = r.tuning
        assert tune == {"tune": "head", "lora": "lora"}.get(next(iter(given), ""), "full")
        assert "measured: the probe" in fit.resolved and "estimated" not in fit.resolved
        forwards = STEP_FORWARDS[tune]
        step_macs = forwards * forward_macs(arch, (32, 32), 3, token_drop=0.5) * r.batch_size
        save_s = save_seconds(params=params, trainable=params if tune == "full" else 0)
        end_s = pace.evaluation_s(forward_macs(arch, (32, 32), 3)) + save_s
        level = fit.resolved.split(" aug (")[0].rsplit("-> ", 1)[1]
        steps = steps_in_budget(pace.budget_left(300.0), pace.per_step(level=level, step_macs=step_macs,
                                batch=r.batch_size), end_s, max(1, n_train // r.batch_size))  # fmt: skip
        assert f"~{steps:,} steps of " in fit.resolved
        assert aug_level(epochs=steps * r.batch_size / n_train, n_train=n_train, finetune=True) == level
        if r.head_warmup:  # LP-FT's warm-up: half the LR warmup of the counted steps, at most an epoch
            assert r.head_warmup == max(1, min(n_train // r.batch_size, round(0.05 * steps)))
    estimated = _fit(3000, budget=300.0)
    assert "estimated for 300 s on cpu" in estimated.resolved  # no probe (shards, several processes): as before
    macs = forward_macs(arch, (32, 32), 3, token_drop=0.5)
    for given, tune in (({}, "full"), ({"lora": 4}, "lora"), ({"tune": "head"}, "head")):
        forwards = STEP_FORWARDS[tune]
        fit = _fit(3000, budget=300.0, **given)
        steps = max(1, int(300.0 * 1e10 / (forwards * macs) / fit.recipe.batch_size))
        assert f"~{steps:,} steps (estimated for 300 s on cpu)" in fit.resolved


@pytest.mark.slow
def test_finetune_with_its_defaults_under_a_time_budget(tmp_path, capsys):
    init = _init(tmp_path)
    data = _folder(tmp_path / "data", ["ant", "bee", "cow", "elk"], per_class=10)
    out = tmp_path / "ft"
    args = ["finetune", "--init", str(init), "--data", str(data), "--out", str(out), "--time-budget", "3s"]
    assert main([*args, "--cache-dir", str(tmp_path / "c"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "auto (fine-tuning" in text and "token drop 0.5 in training" in text and "time budget 3 s: measured" in text
    assert "a step of" in text.split("auto (fine-tuning", 1)[1].split("\n", 1)[0]  # from the probe's pace
    assert "head replaced by a zero-initialised one for 4 classes (other classes" in text
    s = json.loads((out / "summary.json").read_text())
    rc = s["recipe_config"]
    assert (s["recipe"], rc["optimizer"], rc["token_drop"]) == ("auto", "adamw", 0.5)
    # 36 training images, over FULL_FROM a parameter: every weight (issue 60's rule), after LP-FT's head warm-up
    assert rc["tune"] == "full" and rc["head_warmup"] >= 1 and "; method full: " in text
    assert s["recipe_chosen"].startswith("auto (fine-tuning") and "--tune" not in (s.get("advice") or "")


@pytest.mark.slow
def test_the_papers_recipe_is_a_name_away(tmp_path, capsys):
    init = _init(tmp_path)
    data = _folder(tmp_path / "data", NAMES, per_class=10)
    out = tmp_path / "ft"
    args = ["finetune", "--init", str(init), "--data", str(data), "--out", str(out), "--recipe", "finetune"]
    assert main([*args, "--epochs", "1", "--cache-dir", str(tmp_path / "c"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "finetune on 36 images: batch 8" in text and "head kept: the same 4 classes in the same order" in text
    assert json.loads((out / "summary.json").read_text())["recipe_config"]["optimizer"] == "sgd"


# -- the benchmark (benchmarks/finetune_defaults.py: its commands; its --smoke run is left to a manual check) --------


def _bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "finetune_defaults.py"
    spec = importlib.util.spec_from_file_location("finetune_defaults_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_arms_are_the_default_commands(tmp_path):
    """Every arm is a plain command: no recipe, optimizer or LR flags; scratch gets the pre-trained architecture."""
    bench = _bench()
    arch = {"img_size": [32, 32], "patch_size": 4, "embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_dim": 256,
            "pool": "cls", "class_token": True, "posemb": "sincos2d"}  # fmt: skip
    flags = bench.arch_flags(arch)
    assert flags == ["--img-size", "32", "--patch-size", "4", "--dim", "128", "--depth", "4", "--heads", "4",
                     "--mlp-ratio", "2", "--pool", "cls", "--posemb", "sincos2d"]  # fmt: skip
    cmds = bench.arm_commands(pretrained=tmp_path / "m", data=tmp_path / "d", budget="5m", seed=1, arch=flags,
                              out=tmp_path / "o", vitlab=["vitlab"])  # fmt: skip
    assert set(cmds) == {"finetune", "scratch", "probe"} and "--freeze" in cmds["probe"]
    for cmd in cmds.values():
        assert not {"--recipe", "--lr", "--optimizer", "--batch-size"} & set(cmd)
        assert cmd[cmd.index("--time-budget") + 1] == "5m" and cmd[cmd.index("--seed") + 1] == "1"
    pre = bench.pretrain_command(source=tmp_path / "c", img_size="32", budget="10m", seed=1, out=tmp_path / "p",
                                 extra="", vitlab=["vitlab"])  # fmt: skip
    assert pre[:2] == ["vitlab", "train"] and not {"--recipe", "--lr", "--optimizer"} & set(pre)
    old = bench.pretrain_command(source=tmp_path / "c", img_size="32", budget="10m", seed=1, out=tmp_path / "p",
                                 extra="--optimizer adamw", vitlab=["vitlab"])  # fmt: skip
    assert old[old.index("--optimizer") + 1] == "adamw" and old[old.index("--time-budget") + 1] == "10m"
