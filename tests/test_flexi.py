"""FlexiViT patch resizing (Beyer et al. 2023): the PI-resize of the patch projection matches timm's
``resample_patch_embed``, a resized kernel on a resized patch gives the original token, and
``vitlab.load(..., patch_size=)`` loads a checkpoint at another patch size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitlab
from conftest import assert_close_rel
from vitlab.models import resample_patch_embed

timm_layers = pytest.importorskip("timm.layers")
timm_vit = pytest.importorskip("timm.models.vision_transformer")


@pytest.mark.parametrize(("old", "new"), [(16, 8), (8, 12), (8, 16)])
def test_matches_timm(old, new):
    w = torch.randn(6, 3, old, old, generator=torch.Generator().manual_seed(0))
    want = timm_layers.resample_patch_embed(w, [new, new])
    got = resample_patch_embed(w, new)
    assert got.shape == (6, 3, new, new)
    assert_close_rel(got, want)  # (timm inverts in float32, we in float64)


def test_upsized_kernel_on_upsized_patch_gives_the_same_token():
    """The defining property for a larger patch: <resize(x), w'> = <x, w>."""
    w = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w2 = resample_patch_embed(w, 16)
    x2 = F.interpolate(x, size=(16, 16), mode="bicubic", antialias=True, align_corners=False)
    assert_close_rel(F.conv2d(x2, w2, stride=16), F.conv2d(x, w, stride=8), rtol=1e-8)


def test_load_at_another_patch_size():
    ref = timm_vit.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4, mlp_ratio=2.0, num_classes=3
    )
    model = vitlab.load(dict(ref.state_dict()), num_heads=4, patch_size=4)
    assert model.config.patch_size == 4 and model.config.img_size == (32, 32)
    assert model.pos_embed.shape == (1, 1 + 64, 64)
    want = timm_layers.resample_patch_embed(ref.patch_embed.proj.weight.detach(), [4, 4])
    assert_close_rel(model.patch_embed.proj.weight.detach(), want)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)
