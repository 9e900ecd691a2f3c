"""``vitlab finetune --patch-size``: the --init model's patch projection resized as FlexiViT does
(Beyer et al. 2023), then trained; the saved model has the new patch size."""

from __future__ import annotations

import json

import pytest
import torch

import vitlab
from imagefolder import tiny_folder
from vitlab.cli import main

pytestmark = pytest.mark.slow  # end to end: every test here trains and fine-tunes runs

TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--no-progress", "--batch-size", "8", "--recipe", "digits"]


def test_finetune_at_another_patch_size(tmp_path, capsys):
    data = tiny_folder(tmp_path / "data", per_class=8, test_per_class=2)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    src = tmp_path / "src"
    assert (
        main(["train", "--data", str(data), *cache, *TINY, "--patch-size", "4", "--epochs", "1", "--out", f"{src}"])
        == 0
    )
    assert vitlab.load(src / "model").config.patch_size == 4
    capsys.readouterr()

    ft = tmp_path / "ft"
    args = ["finetune", "--init", str(src / "model"), "--data", str(data), *cache, "--epochs", "1", "--batch-size", "8"]
    assert main([*args, "--patch-size", "2", "--no-progress", "--out", str(ft)]) == 0
    assert "patch projection resized 4x4 -> 2x2 (FlexiViT)" in capsys.readouterr().out
    cfg = json.loads((ft / "model" / "config.json").read_text())
    assert cfg["patch_size"] == 2
    m = vitlab.load(ft / "model")
    assert m.patch_embed.proj.weight.shape[-2:] == (2, 2)
    assert m.pos_embed.shape[1] == m.num_prefix_tokens + (8 // 2) ** 2  # the 2x2 grid -> 4x4 patches
    assert summary_steps(ft) >= 1
    with torch.no_grad():
        assert m(torch.zeros(1, 3, 8, 8)).shape == (1, 3)


def summary_steps(run):
    return json.loads((run / "summary.json").read_text())["steps"]


def test_patch_size_with_init_and_a_mismatched_model_is_still_refused(tmp_path, capsys):
    data = tiny_folder(tmp_path / "data", per_class=4, test_per_class=1)
    src = tmp_path / "src"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert (
        main(["train", "--data", str(data), *cache, *TINY, "--patch-size", "4", "--epochs", "1", "--out", f"{src}"])
        == 0
    )
    capsys.readouterr()
    args = ["finetune", "--init", str(src / "model"), "--data", str(data), *cache, "--dim", "32", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "ft")]) == 2
    err = capsys.readouterr().err
    assert "--dim 32 does not match the --init checkpoint" in err and err.count("\n") == 1
