"""A fine-tune of photos under a time budget gets its side from the side rule, as a fresh run does (issue 57, item 2):
its ``--init`` model's side when the budget buys enough passes there, else a smaller one (its position table
resampled). Before, it always trained at the model's side: a DINOv2 at 518 px made one step in a 30-second budget."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import vitlab
from conftest import counting_passes
from imagefolder import photo_folder
from vitlab.cli import main
from vitlab.data.sources import DataSource
from vitlab.distributed import Dist
from vitlab.models import ViTConfig
from vitlab.train import TrainConfig, get_recipe
from vitlab.train.engine.optim import build_optimizer
from vitlab.train.sizing import probe
from vitlab.train.sizing.probe import Here
from vitlab.train.sizing.side import (
    FINETUNE_PASSES,
    budget_init_side,
    folder_storage,
    init_side,
    init_sides,
)


def _cfg(data: Path, **kw) -> TrainConfig:
    return TrainConfig(recipe=get_recipe("auto"), data=str(data), out="unused", progress=False, **kw)


def _counting(table: dict[int, float]):
    return counting_passes(table, FINETUNE_PASSES)


def test_the_sides_are_the_model_s_then_the_ladder_at_its_patch_down_to_an_8x8_grid():
    assert init_sides(518, 14) == [518, 224, 154, 126]  # DINOv2: patch 14 (160 -> 154, 128 -> 126; 64 too few)
    assert init_sides(224, 16) == [224, 160, 128]
    assert init_sides(384, 16) == [384, 224, 160, 128]
    assert init_sides(128, 4) == [128, 64]  # a small patch goes lower: 64 px is 16 x 16 patches of 4
    assert init_sides(32, 4) == [32]  # docs/transfer.md's 32-px models: nothing smaller
    assert init_sides(100, 16) == [100]


def test_a_hybrid_s_sides_are_multiples_of_its_token_not_its_patch(tmp_path):
    """A convolutional stem of stride 16 (patch 1, Hassani et al.'s CCT): 16 px a token, the sides of patch 16."""
    hybrid = ViTConfig(img_size=(256, 256), patch_size=1, stem="conv", stem_layers=4, embed_dim=32, depth=1,
                       num_heads=2, mlp_dim=64)  # fmt: skip
    seen = []

    def passes(side: int, n_train: int) -> float:
        seen.append(side)
        return 0.0

    cfg = _cfg(tmp_path, time_budget=30.0, init="hybrid")
    assert folder_storage(cfg, {(3024, 4032): 24}, init=hybrid, passes=passes).size == (128, 128)
    assert seen == [256, 224, 160, 128]  # not 64 px: 4 x 4 tokens


def test_the_model_s_side_is_kept_when_the_budget_buys_enough_passes_there():
    passes, calls = _counting({518: FINETUNE_PASSES})
    side, why = budget_init_side(518, 14, passes)
    assert (side, calls) == (518, [518]) and why.startswith(f"the --init model's size, ~{FINETUNE_PASSES:.0f} passes")


def test_a_short_budget_takes_the_largest_smaller_side_with_enough_passes():
    passes, calls = _counting({518: 0.4, 224: 3.0, 154: FINETUNE_PASSES + 1})
    side, why = budget_init_side(518, 14, passes)
    assert side == 154 and calls == [518, 224, 154]
    assert why.startswith("a fine-tune under a time budget: ~0.4 passes at 518 px, ~25.0 at 154 px, the largest")
    passes, calls = _counting({518: 0.1, 224: 0.5, 154: 1.0, 126: 1.5})
    assert budget_init_side(518, 14, passes)[0] == 126 and calls == [518, 224, 154, 126]  # none enough: the smallest


def test_a_model_with_no_smaller_side_is_not_measured():
    passes, calls = _counting({})
    assert budget_init_side(32, 4, passes) == (32, "the --init model's size") and calls == []


def test_the_folder_is_stored_for_the_fine_tune_s_side(tmp_path):
    init = ViTConfig(img_size=(518, 518), patch_size=14, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    cfg = _cfg(tmp_path, time_budget=30.0, init="dinov2")
    seen = []

    def passes(side: int, n_train: int) -> float:
        seen.append((side, n_train))
        return 1.0 if side > 224 else 40.0

    plan = folder_storage(cfg, {(3024, 4032): 24}, init=init, n_files=300, passes=passes)
    assert plan.size == (224, 224) and seen == [(518, 300), (224, 300)]
    assert "training at 224 px (a fine-tune under a time budget: ~1.0 passes at 518 px" in plan.line
    plan = folder_storage(cfg, {(3024, 4032): 24}, init=init)  # no budget measured: the model's side, as before
    assert plan.size == (518, 518) and "the --init model's size" in plan.line
    small = folder_storage(cfg, {(32, 32): 24}, init=init, passes=passes)  # not photos: no rule, no measurement
    assert small.size == (518, 518) and len(seen) == 2
    wide = folder_storage(cfg, {(3024, 4032): 24}, init=init.replace(img_size=(224, 448)), passes=passes)
    assert wide.size is None and len(seen) == 2  # a model that is not square: its photos stored for up to 384 px


def test_a_fine_tune_of_a_square_model_chooses_its_side_under_a_budget(tmp_path):
    folder = DataSource.named(str(tmp_path))
    square = ViTConfig(img_size=(224, 224), patch_size=16, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    cfg = _cfg(tmp_path, time_budget=60.0, init="m")
    assert probe.wants_budget_size(cfg, folder, uses_labels=True, dist=Dist(), init=square)
    assert not probe.wants_budget_size(cfg, folder, uses_labels=True, dist=Dist(), init=None)
    wide = square.replace(img_size=(224, 448))
    assert not probe.wants_budget_size(cfg, folder, uses_labels=True, dist=Dist(), init=wide)
    assert not probe.wants_budget_size(_cfg(tmp_path, time_budget=60.0, init="m", img_size=96), folder,
                                       uses_labels=True, dist=Dist(), init=square)  # fmt: skip
    assert not probe.wants_budget_size(_cfg(tmp_path, init="m"), folder, uses_labels=True, dist=Dist(), init=square)
    assert init_side(square) == 224 and init_side(None) is None


def test_the_init_probe_times_its_architecture_once_and_scales_by_the_tokens(tmp_path, monkeypatch):
    """One timed step of the ``--init`` architecture at the cheapest side serves every side: its compute scaled by
    the side's multiply-accumulates, the optimizer's update (timed alone) not; its random draws leave the run's
    generators alone. Faked timings: a step of any size 0.1 s, of which the update 0.01 s."""
    from vitlab.train.sizing.pace import LOGGING_SHARE
    from vitlab.train.sizing.recipe import auto_batch, forward_macs

    init = ViTConfig(img_size=(256, 256), patch_size=16, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    here = Here(dist=Dist(), device=torch.device("cpu"), amp_dtype=None, t_start=time.perf_counter(),
                optimizer=build_optimizer)  # fmt: skip
    built, sizes = [], []
    real = probe.VisionTransformer

    def counting(c):
        built.append(c.img_size)
        return real(c)

    monkeypatch.setattr(probe, "VisionTransformer", counting)
    monkeypatch.setattr(probe, "time_steps", lambda model, opt, xs, ys, **kw: sizes.append(len(xs)) or 0.1)
    monkeypatch.setattr(probe, "time_update", lambda *a, **kw: 0.01)
    torch.manual_seed(3)
    before, threads = torch.get_rng_state(), torch.get_num_threads()
    try:
        seconds = probe._init_image_seconds(_cfg(tmp_path, time_budget=60.0, init="m"), here, init, n_train=64,
                                            clock=lambda: 0.0)  # fmt: skip  # a still clock: no augmentation cost
        at = {side: seconds(side) for side in (256, 160, 128)}
    finally:
        torch.set_num_threads(threads)
    batch = auto_batch(64)
    assert built == [(128, 128)] and sizes[-1] == batch  # timed once, at the smallest side; images doubled to batch
    assert at[128] == pytest.approx(0.1 * LOGGING_SHARE / batch)
    arch = {"patch_size": 16, "embed_dim": 32, "depth": 1, "mlp_dim": 64}

    def compute(side: int) -> float:
        return at[side] * batch / LOGGING_SHARE - 0.01

    for side in (256, 160):
        ratio = forward_macs(arch, (side, side), 3, token_drop=0.5) / forward_macs(arch, (128, 128), 3, token_drop=0.5)
        assert compute(side) == pytest.approx(0.09 * ratio) and ratio > 1  # 256 and 100 tokens against 64
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.slow
def test_a_budgeted_fine_tune_trains_and_saves_at_the_chosen_side(tmp_path, monkeypatch, capsys):
    """The whole run: the side chosen before the photos are decoded, the model's position table resampled to it, and
    ``--config`` of the run replays it without measuring again."""
    m = vitlab.create_model("vit_ti16", img_size=256, patch_size=16, embed_dim=32, depth=1, num_heads=2, num_classes=2)
    vitlab.save(m, tmp_path / "init")
    photo_folder(tmp_path / "photos", size=(600, 800), train=8, val=2)

    def fake(cfg, here, init, *, n_train, **kw):  # 256 px costs the budget's passes many times over; 160 px not
        return lambda side: 1.0 if side > 160 else 1e-4

    monkeypatch.setattr(probe, "_init_image_seconds", fake)
    out = tmp_path / "run"
    common = ["--no-progress", "--workers", "0", "--cache-dir", str(tmp_path / "cache")]
    argv = ["finetune", "--init", str(tmp_path / "init"), "--data", str(tmp_path / "photos"), "--time-budget", "4s",
            "--out", str(out), *common]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "-> training at 160 px (a fine-tune under a time budget: ~" in said and " passes at 256 px, ~" in said
    assert "on 16 images (160x160 px, 2 classes)" in said  # the recipe's steps counted at the side chosen
    trained = vitlab.load(out / "model")
    assert trained.config.img_size == (160, 160) and trained.pos_embed.shape[1] == 1 + 10 * 10

    def measured(*a, **k):
        raise AssertionError("a replayed run measured its side again")

    monkeypatch.setattr(probe, "_init_image_seconds", measured)
    assert main(["train", "--config", str(out / "config.yaml"), "--out", str(tmp_path / "again"), *common]) == 0
    assert vitlab.load(tmp_path / "again" / "model").config.img_size == (160, 160)
