"""Masked patch prediction on photos under a time budget trains at the side the budget buys passes at, by the rule
a classifier's photos follow (issue 57: "one sizing rule on every path"). Before, every MPP run on photos trained
at 224 px: on the clothing photos a 30-second budget bought 1 step (3.4 s each) and the run took 40 s."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitlab.data.sources import DataSource
from vitlab.distributed import Dist
from vitlab.train import TrainConfig, get_recipe
from vitlab.train.engine.optim import build_optimizer
from vitlab.train.sizing import probe
from vitlab.train.sizing.probe import Here


def _mpp(data: Path, recipe: str = "mpp", **kw) -> TrainConfig:
    return TrainConfig(recipe=get_recipe(recipe), objective="mpp", data=str(data), out="unused", progress=False, **kw)


@pytest.mark.parametrize(
    ("recipe", "kw", "dist", "wanted"),
    [
        ("mpp", {"time_budget": 60.0}, Dist(), True),
        ("mpp", {}, Dist(), False),  # --epochs: the photo size, as before
        ("mpp", {"time_budget": 60.0, "img_size": 96}, Dist(), False),
        ("mpp", {"time_budget": 60.0, "init": "runs/x/model"}, Dist(), False),
        ("mpp", {"time_budget": 60.0}, Dist(world_size=2), False),  # each process would measure its own
        ("small-data", {"time_budget": 60.0}, Dist(), False),  # a named recipe other than MPP's own: as asked
    ],
)
def test_masked_patch_prediction_with_its_own_recipe_chooses_its_side_from_the_budget(tmp_path, recipe, kw, dist,
                                                                                      wanted):  # fmt: skip
    folder = DataSource.named(str(tmp_path))
    assert probe.wants_budget_size(_mpp(tmp_path, recipe, **kw), folder, uses_labels=False, dist=dist) is wanted


def test_its_passes_are_timed_on_the_model_and_batch_its_recipe_trains_at_each_side(monkeypatch):
    """The side rule's probe times MPP's own model there (the ``mpp`` recipe's width and depth, its patch for the
    side, no dropped tokens) at MPP's batch, not the classifier the ``auto`` recipe would pick."""
    timed = []

    def fake_steps(model, opt, xs, ys, **kw):
        c = model.config
        timed.append((c.img_size, c.patch_size, c.embed_dim, c.depth, c.patch_drop_rate, len(xs)))
        return 0.1

    monkeypatch.setattr(probe, "time_steps", fake_steps)
    monkeypatch.setattr(probe, "_time_augmentation", lambda *a, **kw: 0.0)
    here = Here(dist=Dist(), device=torch.device("cpu"), amp_dtype=None, t_start=0.0, optimizer=build_optimizer)
    cfg, arch = _mpp(Path("unused"), time_budget=60.0, threads=1), get_recipe("mpp").arch
    before = torch.get_num_threads()
    try:
        seconds = {side: probe._image_seconds(cfg, here, side=side, n_train=3000) for side in (224, 64)}
    finally:
        torch.set_num_threads(before)
    d, depth = arch["embed_dim"], arch["depth"]
    assert timed == [((224, 224), 16, d, depth, 0.0, 32), ((64, 64), 8, d, depth, 0.0, 32)]
    assert seconds[224] == pytest.approx(seconds[64])  # (the same fake step: an image's share of a batch of 32)
