"""The architecture flags -> model overrides of the commands, and the one mlp_ratio -> mlp_dim rule."""

from __future__ import annotations

import argparse

import pytest

from vitlab.errors import ConfigError
from vitlab.models.config import ViTConfig, mlp_dim_for
from vitlab.train.conf.parser import add_options, arch_overrides, config_from_args


def test_mlp_dim_for_and_its_inverse():
    assert mlp_dim_for(192, 4.0) == 768 and mlp_dim_for(100, 2.5) == 250 and mlp_dim_for(3, 0.5) == 2
    cfg = ViTConfig(img_size=8, patch_size=4, embed_dim=96, num_heads=2, mlp_dim=mlp_dim_for(96, 3.0))
    assert cfg.mlp_ratio == pytest.approx(3.0, rel=1e-12)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="mlp_ratio: must be positive"):
            mlp_dim_for(96, bad)


def test_arch_overrides_names_config_fields_and_skips_unset_flags():
    args = argparse.Namespace(patch_size=4, dim=192, depth=None, heads=3, mlp_ratio=2.0, pool="gap", posemb=None)
    assert arch_overrides(args) == dict(
        patch_size=4, embed_dim=192, num_heads=3, mlp_ratio=2.0, pool="gap", class_token=False
    )
    assert arch_overrides(argparse.Namespace(dim=64)) == {"embed_dim": 64}  # a command without the other flags
    assert arch_overrides(argparse.Namespace(pool="cls", posemb="sincos2d")) == dict(
        pool="cls", class_token=True, posemb="sincos2d"
    )


def test_train_flags_reach_the_train_config():
    p = argparse.ArgumentParser()
    add_options(p, command="train")
    args = p.parse_args(["--dim", "64", "--depth", "2", "--heads", "4", "--mlp-ratio", "2", "--pool", "gap"])
    arch = config_from_args(args).arch
    assert arch == dict(embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, pool="gap", class_token=False)
