"""Config validation before any work: each impossible option is a one-line error naming it.

``--data`` points at a folder that does not exist: an error about the option (not about the
data) proves the check runs before any data is touched.
"""

from __future__ import annotations

import pytest

import vitlab
from vitlab.cli import main
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig
from vitlab.train import get_recipe


def run_cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        (["--img-size", "30", "--patch-size", "4"], "--img-size: 30x30 is not divisible by the patch size 4"),
        (["--dim", "30", "--heads", "4"], "--heads: the width 30 is not divisible by 4 heads"),
        (["--dim", "50", "--model", "vit_ti16"], "--heads: the width 50 is not divisible by 3 heads"),
        (["--patch-size", "0"], "--patch-size: must be positive"),
        (["--depth", "0"], "--depth: must be positive"),
        (["--lr", "0"], "--lr: must be positive"),
        (["--lr", "-0.1"], "--lr: must be positive"),
        (["--batch-size", "0"], "--batch-size: must be positive"),
        (["--epochs", "0"], "--epochs: must be positive"),
        (["--epochs", "-3"], "--epochs: must be positive"),
        (["--save-every", "0"], "--save-every 0.0: out of range"),
        (["--stop-after", "0"], "--stop-after 0: out of range"),
        (["--val-split", "1.5"], "--val-split 1.5: out of range"),
        (["--max-image-pixels", "0"], "--max-image-pixels 0: out of range"),
        (["--model", "vit_nonexistent"], "vit_nonexistent"),
    ],
)
def test_bad_options_fail_before_any_work(tmp_path, capsys, flags, expect):
    err = run_cli(
        capsys,
        "train",
        "--data",
        str(tmp_path / "no-such-data"),
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
        *flags,
    )
    assert expect in err, err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_unknown_recipe_and_choices(capsys):
    with pytest.raises(ConfigError, match="unknown recipe 'bogus'; choose one of"):
        get_recipe("bogus")
    for flags in (["--recipe", "bogus"], ["--on-nan", "maybe"]):
        with pytest.raises(SystemExit) as e:
            main(["train", *flags])
        assert e.value.code == 2
        assert "invalid choice" in capsys.readouterr().err


def test_init_with_a_different_architecture_is_named(tmp_path, capsys):
    model = VisionTransformer(
        ViTConfig(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_dim=32, num_classes=3)
    )
    init = str(vitlab.save(model, tmp_path / "init"))
    common = [
        "finetune",
        "--init",
        init,
        "--data",
        str(tmp_path / "no-such-data"),
        "--out",
        str(tmp_path / "ft"),
        "--no-progress",
    ]
    err = run_cli(capsys, *common, "--patch-size", "8")  # accepted: the projection is resized (FlexiViT)
    assert "--patch-size" not in err and "no-such-data" in err
    err = run_cli(capsys, *common, "--depth", "3")
    assert "--depth 3 does not match" in err and "depth = 2" in err
    err = run_cli(capsys, *common, "--model", "vit_ti16")
    assert "--model vit_ti16 does not match" in err
    # flags that agree with the checkpoint are fine: the next error is about the missing data
    err = run_cli(capsys, *common, "--patch-size", "4", "--depth", "2")
    assert "--data" in err and "no-such-data" in err
