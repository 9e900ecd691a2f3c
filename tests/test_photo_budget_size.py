"""Photos under a time budget train at the largest side at which the budget buys enough passes (issue 34: at a
2-minute budget the default 224 px was 7 points below 64 px on the same photos). The side is chosen from timed
steps before the folder is decoded, so the decode cache stores what the chosen side needs."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

from conftest import counting_passes
from vitlab.data.sources import DataSource
from vitlab.distributed import Dist
from vitlab.train import TrainConfig, get_recipe
from vitlab.train.engine.optim import build_optimizer
from vitlab.train.sizing import probe
from vitlab.train.sizing.probe import Here
from vitlab.train.sizing.side import BUDGET_PASSES, budget_photo_side, folder_storage


def _cfg(data: Path, **kw) -> TrainConfig:
    return TrainConfig(recipe=get_recipe("auto"), data=str(data), out="unused", progress=False, **kw)


def _counting(table: dict[int, float], default: float = BUDGET_PASSES):
    return counting_passes(table, default)


def test_the_largest_side_with_enough_passes_is_chosen_measuring_from_the_top():
    passes, calls = _counting({224: 4.0, 160: 9.0, 128: BUDGET_PASSES + 1})
    side, why = budget_photo_side(400, passes)
    assert side == 128 and calls == [224, 160, 128]  # measured from the top, no further than needed
    assert "~4.0 passes at 224 px" in why and f"~{BUDGET_PASSES + 1:.1f} at 128 px" in why and "--img-size" in why


def test_a_budget_that_buys_enough_at_224_measures_once_and_keeps_224():
    passes, calls = _counting({224: BUDGET_PASSES})
    side, why = budget_photo_side(3024, passes)
    assert (side, calls) == (224, [224]) and why.startswith(f"photos: the usual ViT input, ~{BUDGET_PASSES:.0f} passes")


def test_a_budget_too_short_for_every_side_gets_the_smallest_whatever_the_noise_says():
    passes, calls = _counting({224: 2.0, 160: 4.0, 128: 7.0, 64: 6.5})  # 128 px (patch 16) ~ as cheap as 64 (8)
    side, why = budget_photo_side(1080, passes)
    assert side == 64 and calls == [224, 160, 128, 64] and f"~6.5 at 64 px, none with {BUDGET_PASSES:g}" in why
    passes, _ = _counting({}, default=1.0)
    assert budget_photo_side(1080, passes)[0] == 64


def test_small_photos_start_at_their_own_size():
    passes, calls = _counting({192: 3.0})
    assert budget_photo_side(200, passes)[0] == 160 and calls == [192, 160]  # 200 px photos: 192, then the ladder


def test_the_plan_stores_the_folder_for_the_budget_side(tmp_path):
    seen = []

    def passes(side: int, n_train: int) -> float:
        seen.append(n_train)
        return 2.0 if side > 128 else BUDGET_PASSES

    plan = folder_storage(_cfg(tmp_path, time_budget=60.0), {(3024, 4032): 24}, n_files=3000, passes=passes)
    assert plan.size == (128, 128) and plan.store_side == math.floor(128 / 0.875)
    assert plan.eval_side == math.floor(128 / 0.875) and set(seen) == {3000}  # every file counts, not the headers
    assert "training at 128 px (photos under a time budget: ~2.0 passes at 224 px" in plan.line
    assert folder_storage(_cfg(tmp_path), {(3024, 4032): 24}).size == (224, 224)  # no passes given: as before


@pytest.mark.parametrize(
    ("kw", "wanted"),
    [
        ({"time_budget": 60.0}, True),
        ({}, False),
        ({"time_budget": 60.0, "img_size": 96}, False),
        ({"time_budget": 60.0, "init": "runs/x/model"}, False),
        ({"time_budget": 60.0, "pack": True}, True),  # packed photos: the same side rule (issue 57)
    ],
)
def test_only_a_fresh_timed_run_on_a_folder_without_a_size_chooses_it(tmp_path, kw, wanted):
    cfg = _cfg(tmp_path, **kw)
    folder, missing = DataSource.named(str(tmp_path)), DataSource.named(str(tmp_path / "missing"))
    assert probe.wants_budget_size(cfg, folder, uses_labels=True, dist=Dist()) is wanted
    assert not probe.wants_budget_size(_cfg(tmp_path / "missing", time_budget=60.0), missing, uses_labels=True,
                                       dist=Dist())  # fmt: skip
    assert not probe.wants_budget_size(_cfg(tmp_path, time_budget=60.0), folder, uses_labels=False, dist=Dist())


@pytest.mark.slow
def test_measured_passes_fall_with_the_side_and_rise_with_the_budget(tmp_path):
    """Real timed steps: a larger side costs more per image, so the same budget buys fewer passes there."""
    t0 = time.perf_counter()
    here = Here(dist=Dist(), device=torch.device("cpu"), amp_dtype=None, t_start=t0, optimizer=build_optimizer)
    short = probe.budget_passes(_cfg(tmp_path, time_budget=60.0), here)
    long = probe.budget_passes(_cfg(tmp_path, time_budget=600.0), here)
    at_224, at_64 = short(224, 3000), short(64, 3000)
    assert 0 < at_224 < at_64  # 224 px: 3x the tokens (patch 16 against 8) and 12x the pixels to augment
    assert long(64, 3000) > 3 * at_64  # ten times the budget (less the reserve and the time spent); timings vary
    assert short(64, 300) > 3 * at_64  # a tenth of the images


def test_non_square_sizes_name_their_sides(tmp_path):
    """A folder of 50x40 pictures (width x height, as pictures are named) trains a model of height 40 and width 50
    (the model's order): the lines said "images: 50x40" and then "40x50 px", as if the images had been turned."""
    from vitlab._text import size_px

    plan = folder_storage(_cfg(tmp_path), {(50, 40): 24})
    assert plan.size == (40, 50) and plan.line.startswith("images: width 50 x height 40 -> training at their own size")
    assert size_px((40, 50)) == "height 40 x width 50 px" and size_px((64, 64)) == "64x64 px"
    assert folder_storage(_cfg(tmp_path), {(40, 40): 24}).line.startswith("images: 40x40 -> ")
