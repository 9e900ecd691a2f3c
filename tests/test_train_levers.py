"""The speedrun's training levers as ``vitlab train`` options (issue 38): each refused in one line where it cannot
apply (:func:`vitlab.train.conf.rules.check_levers`), and Muon + AdamW as one optimizer whose state ``last.pt``
carries whole (:class:`vitlab.train.engine.optim.MuonAdamW`)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from vitlab import VisionTransformer, ViTConfig
from vitlab.train.conf.options import OptionError
from vitlab.train.conf.recipes import get_recipe
from vitlab.train.conf.rules import validate
from vitlab.train.conf.train_config import build_config
from vitlab.train.engine.optim import MuonAdamW, build_optimizer

BASE = {"data": "d", "model": "vit_ti16", "img_size": 32, "out": "o"}


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"recipe.optimizer": "muon", "fsdp": True}, r"--optimizer muon with --fsdp: not supported"),
        ({"recipe.optimizer": "muon", "recipe.layer_decay": 0.75}, r"muon with --layer-decay"),
        ({"recipe.tta": "flip", "objective": "mpp"}, r"--tta flip averages class logits; --objective mpp"),
        ({"recipe.tta": "flip-last", "objective": "mpp"}, r"--tta flip-last averages class logits; --objective mpp"),
        ({"recipe.whiten_init": True, "init": "runs/x/model"}, r"--whiten-init starts a fresh model; an --init"),
        ({"recipe.whiten_init": True, "model": "vit_r_ti16"}, r"--whiten-init: .*ResNet stem standardises"),
        ({"recipe.mpp_warmup": 0.1, "model": "vit_cct7_3x1"}, r"--mpp-warmup: masked patch prediction predicts"),
        ({"recipe.mpp_warmup": 0.1, "objective": "mpp"}, r"--mpp-warmup warms up a classifier: not with --objective"),
    ],
)
def test_a_lever_that_cannot_apply_is_refused_in_one_line(values: dict, match: str) -> None:
    with pytest.raises(OptionError, match=match) as caught:
        validate(build_config({**BASE, **values}))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "values",
    [
        {"recipe.optimizer": "muon"},
        {"recipe.tta": "flip"},
        {"recipe.tta": "flip-last"},
        {"recipe.whiten_init": True, "model": "vit_cct7_3x1"},
        {"recipe.mpp_warmup": 0.1},
        {"arch.pool": "seq"},
    ],
)
def test_each_lever_is_accepted_where_it_applies(values: dict) -> None:
    validate(build_config({**BASE, **values}))


def _tiny() -> VisionTransformer:
    torch.manual_seed(0)
    cfg = ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3)
    return VisionTransformer(cfg)


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, seeds: range) -> None:
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 3, (4,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="this torch has no torch.optim.Muon")
def test_muon_state_round_trips_and_the_resumed_steps_are_the_uninterrupted_ones() -> None:
    recipe = dataclasses.replace(get_recipe("small-data"), optimizer="muon")
    straight = _tiny()
    opt = build_optimizer(straight, recipe, 1e-3)
    assert isinstance(opt, MuonAdamW)
    muon_params = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    assert muon_params and all(p.ndim == 2 for g in opt.muon.param_groups for p in g["params"])
    assert muon_params.isdisjoint(id(p) for g in opt.adamw.param_groups for p in g["params"])
    _steps(straight, opt, range(2))
    saved_model = _tiny()
    saved_model.load_state_dict(straight.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())  # what last.pt holds: the steps after must not reach it
    assert set(saved_opt) == {"muon", "adamw"} and saved_opt["muon"]["state"] and saved_opt["adamw"]["state"]
    _steps(straight, opt, range(2, 4))

    resumed_opt = build_optimizer(saved_model, recipe, 1e-3)
    resumed_opt.load_state_dict(saved_opt)
    assert len(resumed_opt.param_groups) == len(opt.muon.param_groups) + len(opt.adamw.param_groups)
    _steps(saved_model, resumed_opt, range(2, 4))
    for (name, a), b in zip(straight.state_dict().items(), saved_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_muon_state_of_another_optimizer_is_refused() -> None:
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("this torch has no torch.optim.Muon")
    opt = build_optimizer(_tiny(), dataclasses.replace(get_recipe("small-data"), optimizer="muon"), 1e-3)
    with pytest.raises(ValueError, match="not the state of a Muon"):
        opt.load_state_dict(torch.optim.SGD(_tiny().parameters(), lr=0.1).state_dict())


# --- flip TTA in a run's evaluations: every one, or the last alone ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("tta", ["flip", "flip-last", "none"])
def test_flip_tta_flips_every_evaluation_or_the_last_alone(tmp_path, tta: str) -> None:
    """``--tta flip`` flips each epoch's evaluation, ``flip-last`` the run's last one only: its row says so, and
    its top-1 and loss are those of ``vitlab.evaluate.evaluate_model(..., tta="flip")`` on the saved model."""
    import vitlab
    from imagefolder import tiny_folder
    from vitlab.evaluate.accuracy import evaluate_model
    from vitlab.train import TrainConfig, fit
    from vitlab.train.persist.outputs import read_metrics

    data = tiny_folder(tmp_path / "d", per_class=4, test_per_class=4)
    recipe = dataclasses.replace(
        get_recipe("small-data", epochs=3, batch_size=6, warmup_epochs=0), hflip=0.0, crop_scale=(1.0, 1.0), tta=tta
    )
    out = tmp_path / "run"
    arch = {"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2, "mlp_ratio": 2}
    cfg = TrainConfig(recipe=recipe, data=str(data), out=str(out), arch=arch, img_size=8, seed=0, keep="last",
                      cache_dir=str(tmp_path / "c"), workers=0, progress=False)  # fmt: skip
    fit(cfg)
    rows = read_metrics(out / "metrics.jsonl")
    flipped = {"flip": [True, True, True], "flip-last": [False, False, True], "none": [False, False, False]}[tta]
    assert [r.get("tta") == "flip" for r in rows] == flipped
    got = evaluate_model(vitlab.load(out / "model"), str(data), cache_dir=str(tmp_path / "c"), progress=False,
                         tta="flip" if flipped[-1] else None)  # fmt: skip
    assert got["top1"] == rows[-1]["top1"] and got["loss"] == pytest.approx(rows[-1]["eval_loss"], rel=1e-5)


def test_a_budget_keeps_back_the_last_evaluations_mirrored_pass(monkeypatch) -> None:
    """With ``--tta flip-last`` the plan keeps one more evaluation's time for the run's last one: the steps are those
    that fit in the time left less that evaluation."""
    from vitlab.distributed import Dist
    from vitlab.train.objectives import Classify
    from vitlab.train.sizing import budget

    assert Classify(num_classes=3, tta="flip-last").last_eval_extra == 1.0
    assert Classify(num_classes=3, tta="flip").last_eval_extra == 0.0 == Classify(num_classes=3).last_eval_extra
    assert Classify(num_classes=3, tta="flip-last").eval_passes == 1 < Classify(num_classes=3, tta="flip").eval_passes
    monkeypatch.setattr(budget.time, "perf_counter", lambda: 910.0)  # 10 s of 105 spent, 5 s kept back
    kw = {"step": 100, "planned": 1000, "per_step": 0.11, "overhead_s": 2.5, "dist": Dist()}
    kw["device"] = torch.device("cpu")
    got = {}
    for extra in (0.0, 1.0):
        r = budget.Replanner.for_plan(total_steps=1000, budget=105.0, t_start=900.0, eval_s=2.0, steps_per_epoch=100,
                                      last_extra=extra)  # fmt: skip
        r.due = False
        got[extra] = r.after_epoch(**kw)
    assert got[0.0] == 100 + budget.steps_in_budget(90.0, 0.11, 2.5, 100, 100)
    assert got[1.0] == 100 + budget.steps_in_budget(88.0, 0.11, 2.5, 100, 100) < got[0.0]
