"""The speedrun's training levers as ``vitlab train`` options (issue 38): each refused in one line where it cannot
apply (:func:`vitlab.train.spec.rules.check_levers`), and Muon + AdamW as one optimizer whose state ``last.pt``
carries whole (:class:`vitlab.train.engine.optim.MuonAdamW`)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from vitlab import VisionTransformer, ViTConfig
from vitlab.train.engine.optim import MuonAdamW, build_optimizer
from vitlab.train.spec.config import build_config
from vitlab.train.spec.options import OptionError
from vitlab.train.spec.recipes import get_recipe
from vitlab.train.spec.rules import validate

BASE = {"data": "d", "model": "vit_ti16", "img_size": 32, "out": "o"}


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"recipe.optimizer": "muon", "fsdp": True}, r"--optimizer muon with --fsdp: not supported"),
        ({"recipe.optimizer": "muon", "recipe.layer_decay": 0.75}, r"muon with --layer-decay"),
        ({"recipe.tta": "flip", "objective": "mpp"}, r"--tta flip averages class logits; --objective mpp"),
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
