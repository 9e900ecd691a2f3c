"""Progressive resolution: ``vitlab train --res-schedule 4:0.5,8:1.0``
(:class:`vitlab.train.engine.schedule.StepSchedule`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import assert_close_rel
from imagefolder import tiny_folder
from vitlab import train as trainer_mod
from vitlab.accel import FastVisionTransformer
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig, resample_posemb
from vitlab.train.conf.options import option
from vitlab.train.conf.phases import size_at, step_cost
from vitlab.train.conf.recipes import get_recipe
from vitlab.train.engine import loaders as loaders_mod
from vitlab.train.engine.schedule import StepSchedule, resize_batch
from vitlab.train.sizing.budget import REPLAN_AT


def mean_step_cost(schedule) -> float:
    """The schedule's mean step cost relative to a step at its last size (what the time budget multiplies by)."""
    return StepSchedule(trainer_mod.get_recipe("digits", res_schedule=schedule)).mean_cost()


def parse_res_schedule(text: str):
    """``--res-schedule``'s text as the command line reads it (the option table's row)."""
    return option("--res-schedule").value(text)


def test_parse_and_size_at() -> None:
    s = parse_res_schedule("24:0.5,32:1.0")
    assert s == ((24, 0.5), (32, 1.0))
    assert [size_at(s, step=i, total_steps=10) for i in range(10)] == [24] * 5 + [32] * 5
    assert size_at(parse_res_schedule("16:0.25,24:0.75,32:1"), step=3, total_steps=4) == 32
    for bad in ("24", "24:0.5", "24:0.5,32:0.4", "a:1", "0:1.0", "24:0.6,32:0.6,40:1"):
        with pytest.raises(ConfigError, match="res-schedule"):
            parse_res_schedule(bad)
    assert resize_batch(torch.zeros(2, 3, 32, 32), 24).shape == (2, 3, 24, 24)


def test_time_budget_plans_with_the_mean_step_cost_of_the_schedule() -> None:
    assert mean_step_cost(((32, 1.0),)) == 1.0 == step_cost(32, final=32)
    # half the steps at 24 px: a fixed quarter of a full step plus 0.5625 of the rest
    assert mean_step_cost(((24, 0.5), (32, 1.0))) == pytest.approx(0.5 * (0.25 + 0.75 * 0.5625) + 0.5)
    assert step_cost(16, final=32) < step_cost(24, final=32) < 1.0
    assert mean_step_cost(((16, 0.3), (24, 0.6), (32, 1.0))) < mean_step_cost(((24, 0.6), (32, 1.0)))


@pytest.mark.parametrize("cls", [VisionTransformer, FastVisionTransformer])
@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "jax"])
def test_smaller_grid_uses_exactly_resample_posemb_of_the_table(cls, mode: str) -> None:
    torch.manual_seed(0)
    m = cls(ViTConfig(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, posemb_resample=mode))
    m.train()
    want = resample_posemb(m.pos_embed, (6, 6), num_prefix_tokens=1, mode=mode)
    assert want.shape == (1, 1 + 36, 32)
    assert torch.equal(m.patch_posemb((6, 6)), want[:, 1:])
    x = torch.randn(2, 3, 24, 24)
    z = m.embed(x)  # the 24 px batch: 6x6 patches, each with its row of the resampled table
    assert_close_rel(z[:, 1:], m.patch_embed(x) + want[:, 1:])
    assert_close_rel(z[:, :1], (m.cls_token + m.pos_embed[:, :1]).expand(2, -1, -1))
    m.forward_features(x).square().sum().backward()  # and it trains at that size
    assert m.pos_embed.grad is not None and m.pos_embed.grad.abs().sum() > 0


@pytest.mark.slow
def test_vitlab_train_feeds_the_scheduled_sizes_and_evaluates_at_the_last(tmp_path, monkeypatch, capsys) -> None:
    data = tiny_folder(tmp_path / "data", size=8)
    seen: list[tuple[bool, tuple[int, int]]] = []
    from vitlab.train.engine import run as setup_mod

    build = setup_mod.build_net

    def spy(*a, **k):
        net, line = build(*a, **k)
        net.register_forward_pre_hook(lambda mod, inp: seen.append((mod.training, tuple(inp[0].shape[-2:]))))
        return net, line

    monkeypatch.setattr(setup_mod, "build_net", spy)
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(out), "--dim", "16", "--depth", "1", "--heads", "2"]
    args += ["--patch-size", "2", "--epochs", "2", "--batch-size", "8", "--no-progress", "--res-schedule", "4:0.5,8:1"]
    assert main(args) == 0
    train = [s for t, s in seen if t]
    assert train == [(4, 4)] * 6 + [(8, 8)] * 6  # 48 images, 6 steps an epoch, 12 planned: half at 4 px
    assert {s for t, s in seen if not t} == {(8, 8)}  # evaluation at the final size
    cfg = json.loads((out / "model" / "config.json").read_text())
    assert cfg["img_size"] == [8, 8]
    assert "resolution 4 px to 50%, 8 px to 100% of the steps" in capsys.readouterr().out
    assert main([*args[:-1], "3:0.5,8:1", "--out", str(tmp_path / "c")]) == 2
    assert "3 px is not divisible by the patch size 2" in capsys.readouterr().err
    assert main([*args[:-1], "4:0.5,8:1", "--img-size", "6", "--out", str(tmp_path / "d")]) == 2
    assert "--img-size is 6" in capsys.readouterr().err


@pytest.mark.slow
def test_time_budget_with_a_schedule_re_plans_at_its_last_size(tmp_path, monkeypatch) -> None:
    """The first steps run at the small sizes, faster than the rest: a re-plan from their pace would over-plan the
    run, so a scheduled run keeps its plan until its last size has begun, re-plans from that size's own steps and
    never goes back to a smaller size."""
    from vitlab.train import get_recipe

    monkeypatch.setattr("vitlab.train.sizing.budget.measure_budget", lambda *a, **k: (120, 60, 0.0, 0.05, 0.5))
    sizes: list[int] = []
    resize = loaders_mod.resize_batch  # the square loaders resize a step's input (RunLoaders.step_input)

    def record(x, size):
        y = resize(x, size)
        sizes.append(y.shape[-1])
        return y

    monkeypatch.setattr(loaders_mod, "resize_batch", record)
    cfg = trainer_mod.TrainConfig(
        recipe=get_recipe("digits", batch_size=32, res_schedule=((4, 0.25), (8, 1.0))),
        arch={"embed_dim": 16, "depth": 1, "num_heads": 2},
        out=str(tmp_path / "run"),
        time_budget=6.0,
        workers=0,
        progress=False,
    )
    s = trainer_mod.fit(cfg)
    assert s["steps"] == s["planned_steps"] == len(sizes)
    assert sizes[: 30 + REPLAN_AT] == [4] * 30 + [8] * REPLAN_AT  # a quarter of the first plan at 4 px
    assert set(sizes[30:]) == {8}


def test_a_scheduled_plan_is_re_fitted_from_its_last_sizes_pace(monkeypatch) -> None:
    """With ``--res-schedule 24:0.5,32:1.0`` the early re-plan times steps 5 to 45 of the last size (not the cheap
    first half), the epoch that began before it is no pace, and a faster pace later lengthens the plan only as far
    as keeps every later step at the last size."""
    from vitlab.distributed import Dist
    from vitlab.train.sizing import budget
    from vitlab.train.sizing.pace import steps_in_budget

    clock = [0.0]
    monkeypatch.setattr(budget.time, "perf_counter", lambda: clock[0])
    kw = {"dist": Dist(), "device": torch.device("cpu")}
    r = budget.Replanner.for_plan(total_steps=1000, budget=300.0, t_start=0.0, eval_s=0.0, save_s=0.5,
                                  steps_per_epoch=100)  # fmt: skip
    r.last_size_from = 0.5
    for step in range(1, 546):
        clock[0] += 0.1 if step <= 500 else 0.5  # the small size at 0.1 s a step, the last at 0.5 s
        new = r.after_step(steps_this_run=step, step=step, planned=1000, **kw)
        if step % 100 == 0:
            assert r.after_epoch(step=step, planned=1000, per_step=0.1, overhead_s=0.0, **kw) is None
        if step < 545:
            assert new is None, step
    total, pace = new or (0, 0.0)
    assert pace == pytest.approx(0.5 * 1.02)
    assert total == 545 + steps_in_budget(300.0 - 72.5 - 5.0, 0.51, 0.5, 100, 545) < 1000
    clock[0] += 55 * 0.5
    assert r.after_epoch(step=600, planned=total, per_step=0.01, overhead_s=0.0, **kw) is None  # began at 500
    clock[0] += 100 * 0.05
    longer = r.after_epoch(step=700, planned=total, per_step=0.05, overhead_s=0.0, **kw)
    assert longer == int(700 / 0.5) < 700 + steps_in_budget(300.0 - clock[0] - 5.0, 0.05, 0.0, 100, 700)
    assert all(size_at(((24, 0.5), (32, 1.0)), step=i, total_steps=longer) == 32 for i in range(700, longer))


@pytest.mark.slow
def test_time_budget_probe_scales_by_the_schedules_mean_cost(tmp_path, monkeypatch, capsys) -> None:
    """The probe times the final size; the plan multiplies its step time by ``mean_step_cost``."""
    from vitlab.train.sizing import budget

    seen: list[tuple] = []
    mean_cost = budget.mean_cost

    def spy(recipe, **kw):
        seen.append(recipe.res_schedule)
        return mean_cost(recipe, **kw)

    monkeypatch.setattr(budget, "mean_cost", spy)
    data = tiny_folder(tmp_path / "data", per_class=8, size=16)
    args = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--time-budget", "3s"]
    args += ["--res-schedule", "8:0.5,16:1.0", "--cache-dir", str(tmp_path / "cache"), "--workers", "0"]
    assert main([*args, "--no-progress"]) == 0
    assert seen == [((8, 0.5), (16, 1.0))]
    assert "ms per step on average over the resolution schedule" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("schedule", "until", "dynamic"),
    [(((24, 0.5), (32, 1.0)), 1.0, False), (None, 0.9, False), (None, 1.0, None)],
)
def test_compile_is_static_per_size_under_a_resolution_schedule(monkeypatch, schedule, until, dynamic) -> None:
    """With ``--res-schedule`` (or the end of token dropping, ``--token-drop-until``) and ``--compile`` each input
    shape gets its own static graph: inductor's symbolic-shape code generation did not finish for the hybrid's
    backward once a second size was seen."""
    from types import SimpleNamespace

    from vitlab.train.engine import parallel as build

    seen = {}
    monkeypatch.setattr(build.torch, "compile", lambda m, **kw: seen.update(kw) or m)
    recipe = dataclasses.replace(get_recipe("small-data"), res_schedule=schedule, token_drop=0.5)
    recipe = dataclasses.replace(recipe, token_drop_until=until)
    cfg = SimpleNamespace(fsdp=False, compile=True, recipe=recipe)
    net = torch.nn.Linear(2, 2)
    assert build.distribute(net, cfg, recipe, dist=SimpleNamespace(enabled=False), device=torch.device("cpu")) is net
    assert seen == {"dynamic": dynamic}


@pytest.mark.parametrize(
    ("fields", "share"),
    [
        ({}, 0.0),
        ({"res_schedule": ((4, 0.25), (8, 1.0))}, 0.25),
        ({"mpp_warmup": 0.1}, 0.1),
        ({"mpp_warmup": 0.1, "token_drop": 0.5}, 0.1),
        ({"mpp_warmup": 0.1, "token_drop": 0.5, "res_schedule": ((4, 0.5), (8, 1.0))}, 0.5),
        ({"token_drop": 0.5, "token_drop_until": 0.8}, 0.8),
    ],
)
def test_a_budget_re_plans_from_the_last_stretch_of_one_step_cost(monkeypatch, fields: dict, share: float) -> None:
    """A warm start, a token-drop end or a resolution schedule change the step cost part-way: the plan is
    re-fitted from the pace of the last stretch (a warm start with token dropping used to keep the probe's plan to
    the end, however far off), and never so long that a step goes back to an earlier stretch."""
    from types import SimpleNamespace

    from vitlab.distributed import Dist
    from vitlab.train.conf.phases import last_stretch_from
    from vitlab.train.sizing import budget
    from vitlab.train.sizing.probe import Here

    recipe = get_recipe("digits", batch_size=32, **fields)
    assert last_stretch_from(recipe) == share
    monkeypatch.setattr(budget, "measure_budget", lambda *a, **k: (1000, 100, 0.0, 0.05, 0.5))
    cfg = trainer_mod.TrainConfig(recipe=recipe, out="o", time_budget=60.0)
    here = Here(dist=Dist(), device=torch.device("cpu"), amp_dtype=None, t_start=0.0, optimizer=None)
    _, replan = budget.plan_run(
        cfg, recipe, here, net=None, run_net=None, loaders=SimpleNamespace(steps_per_epoch=10, first_epoch_fills=False),
        lr=1e-3, objective=SimpleNamespace(last_eval_extra=0.0), log=print,
    )  # fmt: skip
    assert replan.last_size_from == share and replan.due and replan.late
    assert replan._capped(100, 10_000) == (int(100 / share) if share else 10_000)


def test_the_early_re_plan_does_not_time_an_evaluation_inside_its_window(monkeypatch) -> None:
    """Steps 5 to 45 (of the run, or of its last stretch) are the early re-plan's pace; an epoch that ends among
    them adds its evaluation and saving to the clock, which are not steps (they are planned apart): the pace is the
    steps' alone, not three times it."""
    from vitlab.distributed import Dist
    from vitlab.train.sizing import budget

    clock = [0.0]
    monkeypatch.setattr(budget.time, "perf_counter", lambda: clock[0])
    kw = {"dist": Dist(), "device": torch.device("cpu")}
    r = budget.Replanner.for_plan(total_steps=1000, budget=300.0, t_start=0.0, eval_s=5.0, steps_per_epoch=20)
    new = None
    for step in range(1, REPLAN_AT + 1):
        clock[0] += 0.1
        new = r.after_step(steps_this_run=step, step=step, planned=1000, **kw)
        if step % 20 == 0:
            clock[0] += 5.0  # the epoch's evaluation and saving
            assert r.after_epoch(step=step, planned=1000, per_step=0.1, overhead_s=5.0, **kw) is None
    _, pace = new or (0, 0.0)
    assert pace == pytest.approx(0.1 * 1.02)
