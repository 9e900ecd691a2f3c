"""Recipes, optimiser groups, schedules and the checkpoint file format."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from vitlab import create_model
from vitlab.errors import ConfigError
from vitlab.train import RECIPES, Recipe, get_recipe
from vitlab.train.engine.optim import MuonAdamW, build_optimizer, param_groups
from vitlab.train.engine.schedule import LRFactor, lr_factor
from vitlab.train.persist.state import atomic_torch_save, get_rng_state, load_state, set_rng_state


def build_scheduler(optimizer, *, total_steps: int, warmup_steps: int, schedule: str = "cosine"):
    """The run's LR schedule: a LambdaLR whose lambda is the step schedule's LR factor (engine.optim)."""
    factor = LRFactor(total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule, min_ratio=0.0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def test_presets_follow_their_sources():
    p = RECIPES["pretrain"]
    assert (p.optimizer, p.betas, p.weight_decay, p.batch_size, p.base_batch) == (
        "adamw",
        (0.9, 0.999),
        0.1,
        4096,
        4096,
    )
    assert (p.schedule, p.warmup_steps, p.clip_grad, p.head, p.lr) == ("linear", 10_000, 1.0, "mlp", 1e-3)
    f = RECIPES["finetune"]
    assert (f.optimizer, f.momentum, f.weight_decay, f.clip_grad, f.schedule, f.head) == (
        "sgd",
        0.9,
        0.0,
        1.0,
        "cosine",
        "linear",
    )
    s = RECIPES["small-data"]
    assert (s.optimizer, s.label_smoothing, s.drop_path, s.mixup, s.cutmix, s.randaugment) == (
        "adamw",
        0.1,
        0.1,
        0.8,
        1.0,
        (2, 9),
    )
    assert s.arch == {"patch_size": 4, "embed_dim": 192, "depth": 9, "num_heads": 12, "mlp_dim": 384}
    for r in RECIPES.values():
        assert r.source and r.expected, r.name


def test_recipe_json_round_trip_and_overrides():
    r = get_recipe("small-data", lr=5e-4, epochs=None)
    assert r.lr == 5e-4 and r.epochs == 100  # None means "not given"
    back = Recipe.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    assert get_recipe("pretrain", batch_size=512).scaled_lr(512) == pytest.approx(1e-3 / 8)
    with pytest.raises(ConfigError, match="unknown recipe"):
        get_recipe("imagenet")
    with pytest.raises(ConfigError, match="optimizer"):
        get_recipe("digits", optimizer="lamb")
    with pytest.raises(ConfigError, match="unknown recipe option"):
        get_recipe("digits", learning_rate=1.0)


def test_no_weight_decay_on_norms_biases_posemb_and_cls():
    m = create_model("vit_ti16", num_classes=10, img_size=32, depth=2)
    decay, no_decay = param_groups(m, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    nd = {names[id(p)] for p in no_decay["params"]}
    d = {names[id(p)] for p in decay["params"]}
    assert {
        "pos_embed",
        "cls_token",
        "norm.weight",
        "norm.bias",
        "blocks.0.norm1.weight",
        "blocks.0.attn.qkv.bias",
        "head.bias",
    } <= nd
    assert {"patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.1.mlp.fc2.weight", "head.weight"} <= d
    assert len(nd) + len(d) == len(list(m.parameters()))
    opt = build_optimizer(m, get_recipe("pretrain"), 1e-3)
    assert isinstance(opt, torch.optim.AdamW) and [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    sgd = build_optimizer(m, get_recipe("finetune"), 0.01)
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9


def test_warmup_then_cosine_or_linear():
    assert lr_factor(0, total_steps=100, warmup_steps=10) == pytest.approx(0.1)
    assert lr_factor(9, total_steps=100, warmup_steps=10) == pytest.approx(1.0)
    assert lr_factor(55, total_steps=100, warmup_steps=10) == pytest.approx(0.5)  # cosine midpoint
    assert lr_factor(55, total_steps=100, warmup_steps=10, schedule="linear") == pytest.approx(0.5)
    assert lr_factor(32, total_steps=100, warmup_steps=10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 22 / 90)))
    assert lr_factor(100, total_steps=100, warmup_steps=10, min_ratio=0.1) == pytest.approx(0.1)
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=2.0)
    sched = build_scheduler(opt, total_steps=20, warmup_steps=4, schedule="linear")
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert (
        lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
        and lrs[4] == pytest.approx(2.0)
        and lrs[-1] == pytest.approx(2.0 / 16)
    )
    state = sched.state_dict()
    sched2 = build_scheduler(torch.optim.SGD(m.parameters(), lr=2.0), total_steps=1, warmup_steps=0)
    sched2.load_state_dict(state)
    assert sched2.lr_lambdas[0].total_steps == 20  # the plan travels with the checkpoint


def test_checkpoint_is_weights_only_and_atomic(tmp_path, monkeypatch):
    torch.manual_seed(3)
    rng = get_rng_state()
    a = torch.rand(3)
    path = tmp_path / "last.pt"
    atomic_torch_save({"rng": rng, "step": 7, "config": "{}"}, path)
    blob = torch.load(path, weights_only=True)
    set_rng_state(blob["rng"])
    torch.testing.assert_close(torch.rand(3), a)
    # a crash while writing the next checkpoint leaves the previous one intact
    real_save = torch.save

    def dying_save(obj, f, *a, **k):
        f.write(b"partial garbage")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"step": 8}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert load_state(path)["step"] == 7


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "muon"])
def test_time_budget_probe_of_a_compiled_model_leaves_its_weights_bit_identical(monkeypatch, optimizer):
    """With --compile the budget planner times the real (compiled) model with the run's optimizer (Muon's step costs
    more than AdamW's); its zero-LR steps must not move a weight."""
    if optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        pytest.skip("this torch has no torch.optim.Muon")
    from types import SimpleNamespace

    import numpy as np

    from vitlab.data import ArrayDataset
    from vitlab.distributed import Dist
    from vitlab.train import TrainConfig
    from vitlab.train.engine.optim import build_optimizer
    from vitlab.train.objectives import Classify
    from vitlab.train.sizing import budget
    from vitlab.train.sizing.probe import Here

    torch.manual_seed(0)
    model = create_model("vit_ti16", img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    imgs = np.random.default_rng(0).integers(0, 255, (8, 8, 8, 3), dtype=np.uint8)
    ds = ArrayDataset(imgs, np.arange(8) % 3, transform=lambda x: x.float() / 255)
    cfg = TrainConfig(
        recipe=get_recipe("digits", weight_decay=0.5, optimizer=optimizer), compile=True, time_budget=60.0
    )
    calls, timed = [], []
    time_steps = budget.time_steps

    def recording(probe, opt, *args, **kwargs):
        timed.append(opt)
        return time_steps(probe, opt, *args, **kwargs)

    monkeypatch.setattr(budget, "time_steps", recording)

    class Compiled(torch.nn.Module):  # stands in for torch.compile's wrapper: the same parameters
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            calls.append(x.shape[0])
            return self.m(x)

    import time

    loaders = SimpleNamespace(  # the loaders' interface the probe reads (engine.loaders.RunLoaders)
        micro=4, steps_per_epoch=2, workers=0, eval_batch=256, num_classes=3, eval_size=len(ds),
        train_items=lambda n: [ds[i % len(ds)] for i in range(n)],
        eval_items=lambda start, stop: [ds[i][0] for i in range(start, stop)],
        collate_train=torch.stack, set_token_drop=lambda rate: False, evaluations=1,
    )  # fmt: skip
    here = Here(dist=Dist(), device=torch.device("cpu"), amp_dtype=None, t_start=time.perf_counter(),
                optimizer=build_optimizer)  # fmt: skip
    steps, epochs, *_ = budget.measure_budget(
        cfg, cfg.recipe, here, net=model, run_net=Compiled(model), loaders=loaders, objective=Classify(num_classes=3),
        log=print,
    )  # fmt: skip
    assert steps >= 1 and epochs >= 1
    assert calls == [4] * 8, "the training probe (7 steps, 1 update) must run through the compiled model, not eval"
    kind = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "muon": MuonAdamW}[optimizer]
    assert len(timed) == 1 and isinstance(timed[0], kind), timed
    assert all(g["lr"] == 0.0 for g in timed[0].param_groups)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())


def test_custom_architectures_are_named_after_what_they_are():
    from vitlab.train import TrainConfig, build_model

    def name(**kw):
        cfg = TrainConfig(recipe=get_recipe("small-data"), **kw)
        return build_model(
            cfg, num_classes=10, in_chans=3, image_size=(32, 32), class_names=list("abcdefghij")
        ).config.name

    assert name(arch={"embed_dim": 32, "depth": 2, "num_heads": 2}) == "vit_p4_d32_l2"
    assert (
        name(model="vit_r_ti16", arch={"patch_size": 1, "embed_dim": 32, "depth": 2, "num_heads": 2})
        == "vit_r_p1_d32_l2"
    )
    assert name(model="vit_ti16") == "vit_ti16"


@pytest.mark.slow
def test_time_budget_re_plans_from_the_runs_own_steps(tmp_path, monkeypatch):
    """A planning probe that is far too optimistic (here: faked) must not make the run overrun its
    budget: the run re-times its own steps early, shortens the schedule, and the cosine still ends at 0."""
    from vitlab import train as trainer
    from vitlab.train.persist.outputs import read_metrics
    from vitlab.train.sizing.budget import REPLAN_AT

    monkeypatch.setattr("vitlab.train.sizing.budget.measure_budget", lambda *a, **k: (100_000, 5_000, 0.0, 0.05, 0.5))
    budget = 6.0
    cfg = trainer.TrainConfig(
        recipe=get_recipe("digits", batch_size=32, warmup_steps=10),
        arch={"embed_dim": 16, "depth": 1, "num_heads": 2},
        out=str(tmp_path / "run"),
        time_budget=budget,
        workers=0,
        progress=False,
    )
    s = trainer.fit(cfg)
    assert REPLAN_AT < s["steps"] < 100_000
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert (
        rows[-1]["step"] == s["steps"] and rows[-1]["lr"] < 0.02 * rows[0]["lr"]
    )  # the re-fitted cosine reached its end
    assert s["wall_s"] < 2 * budget  # generous: a functional check that the plan changed, not a speed test


def test_steps_in_budget_counts_the_evaluations_still_to_come():
    from vitlab.train.sizing.budget import steps_in_budget as _steps_in_budget

    assert _steps_in_budget(100.0, 1.0, 0.5, 10) == 95  # 95 steps + 10 epoch ends of 0.5 s (saving) = 100 s
    assert _steps_in_budget(100.0, 1.0, 10.0, 10) == 50  # 5 epochs of 10 steps + 5 evaluations and savings of 10 s
    # mid-epoch: 5 steps of epoch 1 done; its evaluation is still to come
    assert _steps_in_budget(25.0, 1.0, 10.0, 10, done=5) == 5


def test_epoch_end_correction_fits_the_steps_left_to_the_last_epochs_pace(monkeypatch):
    """The pace drifts after the early re-plan (here 10 % slower than planned): at an epoch's end the steps
    still to go are fitted to what the last stretch's pace and end-of-epoch work leave room for, so the run ends on
    time; a drift inside the tolerance leaves the plan alone, a plan shorter than what fits is lengthened, and
    nothing moves before the early re-plan."""
    from vitlab.distributed import Dist
    from vitlab.train.sizing import budget

    clock = [1000.0]
    monkeypatch.setattr(budget.time, "perf_counter", lambda: clock[0])
    kw = {"dist": Dist(), "device": torch.device("cpu")}

    def replanner(spent: float):
        r = budget.Replanner.for_plan(total_steps=1000, budget=105.0, t_start=900.0, eval_s=1.0, steps_per_epoch=100)
        r.due, clock[0] = False, 900.0 + spent  # the early re-plan happened (at step 0, as if)
        return r

    r = budget.Replanner.for_plan(total_steps=1000, budget=105.0, t_start=900.0, eval_s=1.0, steps_per_epoch=100)
    assert r.after_epoch(step=100, planned=1000, per_step=0.1, overhead_s=1.5, **kw) is None  # still due
    # 100 s spent, 5 s kept back: 900 more steps at 0.1 s and 9 epochs' work at 1.5 s do not fit in 0 s
    assert replanner(100.0).after_epoch(step=100, planned=1000, per_step=0.1, overhead_s=1.5, **kw) == 100
    # 10 s spent, 90 s left: 900 more steps at 0.11 s do not fit, fewer do
    new = replanner(10.0).after_epoch(step=100, planned=1000, per_step=0.11, overhead_s=1.5, **kw)
    assert new == 100 + budget.steps_in_budget(90.0, 0.11, 1.5, 100, 100) and 700 < new < 900
    evals = math.ceil(new / 100) - 1
    assert (new - 100) * 0.11 + evals * 1.5 <= 90 < (new - 99) * 0.11 + evals * 1.5  # as many as fit, no more
    assert replanner(10.0).after_epoch(step=100, planned=new + 10, per_step=0.11, overhead_s=1.5, **kw) is None
    assert replanner(10.0).after_epoch(step=100, planned=new - 100, per_step=0.11, overhead_s=1.5, **kw) == new
    assert budget.Replanner().after_epoch(step=100, planned=1000, per_step=1.0, overhead_s=0.0, **kw) is None


def test_a_slow_epoch_is_no_change_of_pace_but_a_slower_machine_cuts_the_run_and_a_faster_one_lengthens_it(monkeypatch):
    """The plan follows the machine's pace both ways, beyond its band, and not its noise. The first judged epoch has
    nothing to be weighed against: 20 % slower than the plan's pace, it cuts the steps still to go to what fits at
    its pace. After it, one epoch slowed by a passing load (20 % over the run's pace) is no change of the machine's
    pace: the time it lost comes out of the steps at the run's mean pace (not at the slow epoch's), and the epochs at
    the pace again leave the plan alone. A machine that halves its speed is a change after two epochs: the plan is
    then cut to the new pace (not to a mean of old and new), and one that doubles it again lengthens the plan, after
    two epochs too, by what the time left allows at that pace (the time lost is not made up twice). Before, each
    epoch was judged by its own pace: the passing load cut the plan at its pace, and the next epoch lengthened it
    again."""
    from vitlab.distributed import Dist
    from vitlab.train.sizing import budget

    clock = [910.0]  # 10 s of 205 spent
    monkeypatch.setattr(budget.time, "perf_counter", lambda: clock[0])
    kw = {"dist": Dist(), "device": torch.device("cpu"), "overhead_s": 1.5}
    r = budget.Replanner.for_plan(total_steps=2000, budget=205.0, t_start=900.0, eval_s=1.0, steps_per_epoch=100,
                                  per_step=0.1)  # fmt: skip
    r.due = False  # the early re-plan happened
    step, planned = 0, 1800

    def epoch(pace: float) -> int | None:
        nonlocal step, planned
        step, clock[0] = step + 100, clock[0] + 100 * pace + 1.5
        new = r.after_epoch(step=step, planned=planned, per_step=pace, **kw)
        planned = new or planned
        return new

    def fits(pace: float) -> int:  # the plan that ends on the budget at ``pace`` from here
        return step + budget.steps_in_budget(205.0 - (clock[0] - 900.0) - 5.0, pace, 1.5, 100, step)

    assert epoch(0.12) == fits(0.12) < 1800  # the first judged epoch, 20 % slow: cut at its pace
    assert [epoch(0.12), epoch(0.12)] == [None, None]
    was = planned
    assert epoch(0.144) == fits(0.126) < was  # the lost time, at the run's mean pace: (3 x 0.12 + 0.144) / 4
    assert r.per_step == pytest.approx(0.126) and planned > fits(0.144)
    assert [epoch(0.12), epoch(0.12)] == [None, None]  # at the pace again: no move back
    epoch(0.24)  # half the speed: one epoch is no change yet (its lost time at the run's mean)
    assert r.per_step < 0.2
    assert epoch(0.24) == fits(0.24) and r.per_step == pytest.approx(0.24)  # two: a change, cut to the new pace
    halved = planned
    epoch(0.12)
    assert epoch(0.12) == fits(0.12) > halved and r.per_step == pytest.approx(0.12)  # and back: lengthened


@pytest.mark.slow
def test_epoch_end_correction_keeps_a_finished_warmup_and_anneals_to_the_new_end(tmp_path, monkeypatch, step_lrs):
    """A time-budgeted run planned at 300 steps (warmup 10 %: 30) is cut to 200 at its first epoch's end
    (faked, after its warmup): the warmup stays at 30 steps, the LR decays from where it was, without a jump
    up, and the cosine ends at the new end."""
    from vitlab.train import fit
    from vitlab.train.engine import trainer
    from vitlab.train.sizing import budget

    monkeypatch.setattr("vitlab.train.sizing.budget.measure_budget", lambda *a, **k: (300, 7, 0.0, 0.05, 0.5))
    monkeypatch.setattr(budget.Replanner, "after_step", lambda self, **_: None)
    calls = []

    def slower(self, *, step, planned, **_):
        calls.append((step, planned))
        return 200 if len(calls) == 1 else None

    monkeypatch.setattr(budget.Replanner, "after_epoch", slower)
    lrs = step_lrs
    saved: list[tuple[int, int]] = []  # (step, planned total) of every last.pt written
    checkpoint = trainer.Trainer._checkpoint

    def record_plan(self, *, micro_done):
        saved.append((self.position.step, self.plan.total_steps))
        return checkpoint(self, micro_done=micro_done)

    monkeypatch.setattr(trainer.Trainer, "_checkpoint", record_plan)
    cfg = trainer.TrainConfig(
        recipe=get_recipe("digits", batch_size=32, warmup_steps=0, warmup_epochs=0.0, warmup_fraction=0.1),
        arch={"embed_dim": 16, "depth": 1, "num_heads": 2},
        out=str(tmp_path / "run"),
        time_budget=600.0,
        workers=0,
        progress=False,
    )
    s = fit(cfg)
    first_epoch, planned = calls[0]
    assert planned == 300 and 30 < first_epoch < 200
    assert [t for st, t in saved if st == first_epoch][-1] == 200  # a resume after the cut keeps the cut plan
    assert s["steps"] == 200 and len(lrs) == 200
    assert lrs.index(max(lrs)) == 28  # the peak at the warmup's end (read after the scheduler steps)
    assert all(b <= a for a, b in itertools.pairwise(lrs[28:]))  # a decay from there to the end, through the cut
    assert lrs[-1] < 0.01 * max(lrs)
    plan = torch.load(tmp_path / "run" / "last.pt", weights_only=False)["plan"]
    assert plan["warmup_steps"] == 30 and plan["total_steps"] == 200
