"""``benchmarks/bench_photo_pipeline.py`` (issue 34, item 5): its rows on tiny generated photos, and that the vitlab
rows time the run's own pipeline (vitlab's ``train_transform`` with the level's recipe, per-sample seeding, the
run's sampler), not some other transform."""

from __future__ import annotations

import json
from types import ModuleType

import pytest
import torch
from torch.utils.data import DistributedSampler

from benchscripts import load
from vitlab.data import ArrayDataset, train_transform
from vitlab.data.pipeline.seeding import SeededItems
from vitlab.train.sizing.levels import level_fields
from vitlab.train.sizing.recipe import BUDGET_TOKEN_DROP
from vitlab.train.sizing.side import PHOTO_CROP_PCT, holds_photos, store_side


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """The script as a module, its shared helper importable as when the script runs."""
    return load("bench_photo_pipeline")


@pytest.mark.slow
def test_smoke_rows_table_and_files(bench, tmp_path, capsys):
    rows = bench.main(["--smoke", "--out", str(tmp_path)])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert printed == rows
    assert [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()] == rows
    (decode,) = [r for r in rows if r["kind"] == "vitlab_decode"]
    assert decode["size"] == 32 and decode["images"] == 32 and decode["img_per_s"] > 0
    assert decode["stored_shorter_side"] == store_side(32, PHOTO_CROP_PCT)  # decoded at the size training needs
    assert not (tmp_path / "cache").exists(), "the size's decode cache is deleted after it"
    for level in ("minimal", "light"):
        mine = [r for r in rows if r.get("level") == level]
        vit = [r for r in mine if r["kind"] == "vitlab_epoch"]
        assert sum(r["run_choice"] for r in vit) == 1 and {0, 1} <= {r["workers"] for r in vit}
        assert [r["workers"] for r in mine if r["kind"] == "timm_epoch"] == [0, 1]
        (model,) = [r for r in mine if r["kind"] == "model_step"]
        assert model["threads"] == 1 and model["token_drop"] == BUDGET_TOKEN_DROP and model["patch"] == 4
        for r in mine:
            assert r["img_per_s"] > 0
            if r["kind"] != "model_step":
                assert r["images"] == 2 * r["batch"] and r["cores"] == (r["workers"] or r["main_threads"])
                assert r["img_per_s_per_core"] == pytest.approx(r["img_per_s"] / r["cores"], abs=0.1)
    table = (tmp_path / "table.md").read_text().splitlines()
    assert len(table) == 4 and table[2].startswith("| 32 | minimal |") and table[3].startswith("| 32 | light |")
    assert all(cell.strip() != "-" for cell in table[3].split("|")[1:-1])


def test_vitlab_rows_time_the_runs_own_augmentation(bench, tmp_path):
    """The first timed batch is, pixel for pixel, vitlab's ``train_transform`` with the light level's recipe on the
    stored photos the run's sampler picks first, each drawn from its own seed; the minimal level's transform on
    the same images gives other pixels, so a benchmark timing another transform fails here."""
    root = bench.make_photos(tmp_path / "photos", n=32, sizes=bench.SMOKE_SIZES)
    cfg = bench.run_config(str(root), size=32, out=tmp_path, time_budget=600, batch=8)
    data, _ = bench.decode(cfg, out=tmp_path)
    cfg = bench.level_config(cfg, data, "light")
    rows, (xs, _), objective, net = bench.vitlab_rows(cfg, data, extra_workers=[], n=1)
    assert len(rows) == 1 and rows[0]["run_choice"] and xs.shape == (8, 3, 32, 32)
    r, mc = cfg.recipe, objective.exported(net).config
    light = level_fields("light", photos=holds_photos(data))
    assert r.randaugment == light["randaugment"] and r.crop_pct == PHOTO_CROP_PCT

    def first_batch(**level) -> torch.Tensor:
        tf = train_transform(
            img_size=mc.img_size, mean=mc.mean, std=mc.std, in_chans=3, hflip=r.hflip, crop_pct=r.crop_pct, **level
        )
        ds = ArrayDataset(data.train.images, data.train.labels, transform=tf, in_chans=3)
        sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=cfg.seed, drop_last=True)
        sampler.set_epoch(0)
        items = SeededItems(ds, seed=cfg.seed, epoch=0)
        return torch.stack([items[i][0] for i in list(sampler)[:8]])

    light = {k: light[k] for k in ("crop_scale", "crop_ratio", "randaugment", "random_erasing")}
    assert torch.equal(xs, first_batch(**light))
    off = level_fields("minimal", photos=holds_photos(data))
    minimal = {k: off[k] for k in ("crop_scale", "crop_ratio", "randaugment", "random_erasing")}
    assert not torch.equal(xs, first_batch(**minimal))
