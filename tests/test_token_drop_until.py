"""Unmasked tuning: ``vitlab train --token-drop R --token-drop-until F``
(:class:`vitlab.train.engine.schedule.StepSchedule`)."""

from __future__ import annotations

import json

import pytest
import torch

from imagefolder import tiny_folder
from vitlab.accel import FastVisionTransformer
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.models.layers import set_patch_drop as set_rate
from vitlab.train.conf.recipes import get_recipe
from vitlab.train.engine.schedule import LRFactor, StepSchedule


def _steps(recipe, total_steps: int) -> StepSchedule:
    return StepSchedule(recipe, lr=LRFactor(total_steps=total_steps, warmup_steps=0, schedule="cosine", min_ratio=0))


def switch_step(recipe, *, total_steps: int) -> int | None:
    return _steps(recipe, total_steps).token_drop_switch()


def rate_at(recipe, *, step: int, total_steps: int) -> float:
    return _steps(recipe, total_steps).lookup(step).token_drop_rate


def mean_step_cost(recipe, *, full_over_dropped: float) -> float:
    return _steps(recipe, 1).mean_cost(full_over_dropped=full_over_dropped)


def test_switch_step_and_rate_follow_the_plan() -> None:
    r = get_recipe("small-data", token_drop=0.5, token_drop_until=0.75)
    assert switch_step(r, total_steps=12) == 9
    assert [rate_at(r, step=s, total_steps=12) for s in range(12)] == [0.5] * 9 + [0.0] * 3
    assert switch_step(r, total_steps=8) == 6  # a re-planned, shorter run moves the switch with its end
    assert switch_step(get_recipe("small-data", token_drop=0.5), total_steps=12) is None
    assert rate_at(get_recipe("small-data", token_drop=0.5), step=11, total_steps=12) == 0.5
    assert mean_step_cost(r, full_over_dropped=1.8) == pytest.approx(0.75 + 0.25 * 1.8)
    assert mean_step_cost(get_recipe("small-data", token_drop=0.5), full_over_dropped=1.8) == 1.0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"token_drop_until": 0.9}, "give --token-drop R too"),
        ({"token_drop": 0.5, "token_drop_until": 0.0}, r"must be in \(0, 1\]"),
        ({"token_drop": 0.5, "token_drop_until": 1.5}, r"must be in \(0, 1\]"),
    ],
)
def test_bad_values_are_one_line_errors(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        get_recipe("small-data", **kw)


@pytest.mark.parametrize("cls", [VisionTransformer, FastVisionTransformer])
def test_set_rate_switches_the_models_token_dropping(cls) -> None:
    torch.manual_seed(0)
    cfg = ViTConfig(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32, patch_drop_rate=0.5)
    m = cls(cfg, num_classes=3).train()
    seen: list[int] = []
    m.blocks[0].register_forward_pre_hook(lambda mod, inp: seen.append(inp[0].shape[1]))
    x = torch.randn(2, 3, 16, 16)
    m(x)
    assert set_rate(m, 0.0) and not set_rate(m, 0.0)
    m(x)
    assert seen == [1 + 8, 1 + 16]  # 16 patches: 8 kept, then every one
    if isinstance(m, FastVisionTransformer):
        assert not m.drops_tokens()
    plain = cls(ViTConfig(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_dim=32))
    assert not set_rate(plain, 0.0)  # built without token dropping: nothing to switch


@pytest.mark.slow
def test_vitlab_train_drops_tokens_until_the_switch_then_sees_every_token(tmp_path, capsys, monkeypatch) -> None:
    data = tiny_folder(tmp_path / "data", size=8)
    seen: list[tuple[bool, int]] = []
    from vitlab.train.engine import run as setup_mod

    build = setup_mod.build_net

    def spy(*a, **k):
        net, line = build(*a, **k)
        net.blocks[0].register_forward_pre_hook(lambda mod, inp: seen.append((mod.training, inp[0].shape[1])))
        return net, line

    monkeypatch.setattr(setup_mod, "build_net", spy)
    args = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--dim", "16", "--depth", "1"]
    args += ["--heads", "2", "--patch-size", "2", "--epochs", "2", "--batch-size", "8"]
    args += ["--token-drop", "0.5", "--token-drop-until", "0.75"]
    assert main(args) == 0
    train = [n for t, n in seen if t]
    full = train[-1]  # 16 patches (and any prefix tokens); 6 steps an epoch, 12 planned: the last quarter unmasked
    assert train == [full - 8] * 9 + [full] * 3
    assert {n for t, n in seen if not t} == {full}
    out = capsys.readouterr().out
    assert "token dropping ends after step 9 of 12" in out and "for the first 75% of the steps" in out


@pytest.mark.slow
def test_time_budget_probe_times_the_unmasked_steps_and_keeps_its_plan(tmp_path, monkeypatch, capsys) -> None:
    """The probe times a step on every token as well, plans with the mean cost, and the run does not re-plan
    from its first (dropping, cheaper) steps."""
    from vitlab.train.sizing import budget

    rates: list[float] = []
    monkeypatch.setattr(budget, "set_patch_drop", lambda m, r: rates.append(r) or set_rate(m, r))
    costs: list[float] = []  # the measured ratio, and the plan multiplied by a cost that leaves room for 1 step
    monkeypatch.setattr(budget, "mean_cost", lambda recipe, full_over_dropped: costs.append(full_over_dropped) or 1e6)
    # the optimizer's update, timed alone, is not multiplied by the cost: on a loaded machine its timing could
    # reach the whole step's and leave nothing to multiply (a plan of one epoch, not one step)
    monkeypatch.setattr(budget, "time_update", lambda *a, **k: 0.0)
    data = tiny_folder(tmp_path / "data", per_class=8, size=16)
    args = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--time-budget", "3s", "--patch-size", "4"]
    args += ["--token-drop", "0.5", "--token-drop-until", "0.8", "--cache-dir", str(tmp_path / "cache")]
    assert main([*args, "--workers", "0", "--no-progress"]) == 0
    assert rates == [0.0, 0.5]  # every token for the second timing, then back
    assert len(costs) == 1 and costs[0] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["planned_steps"] == 1
    out = capsys.readouterr().out
    assert "with every token for the last 20% of the steps, at " in out and "x the time of a step that drops" in out


@pytest.mark.slow
def test_a_resumed_run_past_the_switch_trains_on_every_token(tmp_path, capsys, monkeypatch) -> None:
    data = tiny_folder(tmp_path / "data", size=8)
    seen: list[int] = []
    from vitlab.train.engine import run as setup_mod

    build = setup_mod.build_net

    def spy(*a, **k):
        net, line = build(*a, **k)
        net.blocks[0].register_forward_pre_hook(lambda mod, inp: seen.append(inp[0].shape[1]) if mod.training else None)
        return net, line

    monkeypatch.setattr(setup_mod, "build_net", spy)
    out = str(tmp_path / "run")
    args = ["train", "--data", str(data), "--out", out, "--dim", "16", "--depth", "1", "--heads", "2"]
    args += ["--patch-size", "2", "--epochs", "2", "--batch-size", "8", "--token-drop", "0.5"]
    args += ["--token-drop-until", "0.5", "--no-progress"]
    assert main([*args, "--stop-after", "8"]) == 0
    full = seen[-1]
    assert seen == [full - 8] * 6 + [full] * 2  # 12 planned steps: the switch after 6
    seen.clear()
    assert main(["train", "--out", out, "--resume", "--no-progress"]) == 0
    assert seen == [full] * 4  # the 4 steps left, on every token from the first
