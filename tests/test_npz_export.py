"""Export to Google's .npz (vit_jax and big_vision layouts): timm's own npz loader
(``timm.models.vision_transformer._load_weights``) reads the written file into a timm model whose
logits match vitlab's, and ``vitlab.load`` reads it back to the same model (big_vision MAP heads
included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vitlab
from conftest import assert_close_rel
from vitlab.checkpoints.npz_write import write_npz
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig

timm_vit = pytest.importorskip("timm.models.vision_transformer")

OURS = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7, act="gelu")
TIMM = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=7)


def randomized(**fields) -> VisionTransformer:
    model = VisionTransformer(ViTConfig(**{**OURS, **fields}))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


CASES = {
    "vit_jax_cls": ("vit_jax", {}, {}),
    "vit_jax_gap": (
        "vit_jax",
        {"pool": "gap", "class_token": False},
        {"global_pool": "avg", "class_token": False, "fc_norm": False},
    ),
    "vit_jax_pre_logits": ("vit_jax", {"head": "mlp"}, None),
    "big_vision_cls": ("big_vision", {}, {"no_embed_class": True}),
    "big_vision_gap": (
        "big_vision",
        {"pool": "gap", "class_token": False},
        {"global_pool": "avg", "class_token": False, "fc_norm": False},
    ),
    "big_vision_map": (
        "big_vision",
        {"pool": "map", "class_token": False},
        {"global_pool": "map", "class_token": False},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_loads_in_timm_and_back(tmp_path, case):
    layout, fields, timm_kwargs = CASES[case]
    model = randomized(**fields)
    path = tmp_path / "m.npz"
    write_npz(model, path, layout=layout)
    keys = set(np.load(path).files)
    assert ("params/embedding/kernel" in keys) == (layout == "big_vision")
    x = images()
    with torch.no_grad():
        want = model(x)
        assert want.abs().max() > 0.1
        if timm_kwargs is not None:  # (timm's loader drops pre-logits layers)
            ref = timm_vit.VisionTransformer(**TIMM, **timm_kwargs).eval()
            timm_vit._load_weights(ref, str(path))
            assert_close_rel(ref(x), want)
        back = vitlab.load(path, act="gelu")
        assert (back.config.pool, back.config.class_token) == (model.config.pool, model.config.class_token)
        assert_close_rel(back(x), want)


def test_export_refuses_what_google_has_no_layout_for(tmp_path):
    with pytest.raises(ConfigError, match="init_values"):
        write_npz(randomized(init_values=0.1), tmp_path / "x.npz")
    with pytest.raises(ConfigError, match="pool"):
        write_npz(randomized(pool="map", class_token=False), tmp_path / "x.npz", layout="vit_jax")
    with pytest.raises(ConfigError, match="layout"):
        write_npz(randomized(), tmp_path / "x.npz", layout="flax")


def test_convert_command_writes_npz(tmp_path, capsys):
    """`vitlab convert SRC out.npz --layout big_vision [--patch-size]`; an existing file needs --overwrite."""
    from vitlab.cli import main

    model = randomized(pool="gap", class_token=False)
    vitlab.save(model, tmp_path / "m")
    out = tmp_path / "m.npz"
    assert main(["convert", str(tmp_path / "m"), str(out), "--layout", "big_vision"]) == 0
    assert "params/MAPHead_0/probe" not in np.load(out).files and "params/embedding/kernel" in np.load(out).files
    with torch.no_grad():
        assert_close_rel(vitlab.load(out, act="gelu")(images()), model(images()))
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "m"), str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "m"), str(out), "--overwrite", "--patch-size", "4"]) == 0
    assert np.load(out)["embedding/kernel"].shape == (4, 4, 3, 64)
    assert not list(tmp_path.glob(".m.npz.tmp*"))


@pytest.mark.parametrize("layout", ["vit_jax", "big_vision"])
def test_a_rectangular_grid_with_a_class_token_comes_back(tmp_path, layout):
    """big_vision's table holds the patches' rows only; the reader told it from vit_jax's (class row included) by
    its length being a square, so a 4 x 5 grid's table read back one row short ("mis-shaped pos_embed (1, 20, 64) vs
    model (1, 21, 64)"). Now the array's name says which it is."""
    model = randomized(img_size=(32, 40))
    write_npz(model, tmp_path / "m.npz", layout=layout)
    x = torch.randn(3, 3, 32, 40, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close_rel(vitlab.load(tmp_path / "m.npz", act="gelu")(x), model(x))
