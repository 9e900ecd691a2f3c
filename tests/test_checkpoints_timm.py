"""timm state dicts load directly: logits match timm's (1e-5 of their size) (cls, gap, fc_norm), any file type."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

import vitlab
from conftest import assert_close_rel

timm_vit = pytest.importorskip("timm.models.vision_transformer")

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=7)


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random non-trivial weights everywhere, the head included (timm zero-inits nothing we rely on)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0  # LayerNorm scales around 1
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def save_state(state: dict[str, torch.Tensor], path) -> str:
    state = {k: v.contiguous() for k, v in state.items()}
    if str(path).endswith(".safetensors"):
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return str(path)


def images(n: int = 3, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("kwargs", "pool", "fc_norm", "class_token"),
    [
        ({}, "cls", False, True),
        (
            {"global_pool": "avg", "class_token": False, "fc_norm": False},
            "gap",
            False,
            False,
        ),  # vit_base_patch16_gap_224-style
        ({"global_pool": "avg", "class_token": False, "fc_norm": True}, "gap", True, False),
        (
            {"global_pool": "avg", "fc_norm": True},
            "gap",
            True,
            True,
        ),  # MAE/BEiT-style: class token kept, mean of patches
    ],
)
def test_timm_parity(tmp_path, kwargs, pool, fc_norm, class_token):
    ref = randomize(timm_vit.VisionTransformer(**TINY, **kwargs))
    path = save_state(ref.state_dict(), tmp_path / "timm.safetensors")
    model = vitlab.load(path, num_heads=4)
    cfg = model.config
    assert (cfg.pool, cfg.fc_norm, cfg.class_token) == (pool, fc_norm, class_token)
    assert (cfg.embed_dim, cfg.depth, cfg.mlp_dim, cfg.patch_size, cfg.img_size, cfg.num_classes) == (
        64,
        2,
        128,
        8,
        (32, 32),
        7,
    )
    x = images()
    with torch.no_grad():
        want, got = ref(x), model(x)
    assert want.abs().max() > 0.1  # the head is not zero: the comparison means something
    assert_close_rel(got, want)


@pytest.mark.parametrize("suffix", [".pth", ".bin"])
def test_pickled_state_dicts(tmp_path, suffix):
    ref = randomize(timm_vit.VisionTransformer(**TINY))
    model = vitlab.load(save_state(ref.state_dict(), tmp_path / f"timm{suffix}"), num_heads=4)
    with torch.no_grad():
        assert_close_rel(model(images()), ref(images()))


def test_heads_from_the_paper_table(tmp_path):
    """Width 192 is ViT-Ti: 3 heads, without being told."""
    ref = randomize(
        timm_vit.VisionTransformer(img_size=32, patch_size=16, embed_dim=192, depth=1, num_heads=3, num_classes=5)
    )
    model = vitlab.load(save_state(ref.state_dict(), tmp_path / "ti.pth"))
    assert model.config.num_heads == 3
    x = images()
    with torch.no_grad():
        assert_close_rel(model(x), ref(x))


def test_unknown_width_warns_and_guesses(tmp_path):
    ref = randomize(timm_vit.VisionTransformer(**TINY))
    with pytest.warns(UserWarning, match="num_heads"):
        model = vitlab.load(save_state(ref.state_dict(), tmp_path / "t.pth"))
    assert model.config.num_heads == 1


def test_wrapped_and_prefixed_state_dict(tmp_path):
    """Training scripts save {'model': sd, 'epoch': n} and DataParallel adds 'module.'."""
    ref = randomize(timm_vit.VisionTransformer(**TINY))
    wrapped = {"model": {f"module.{k}": v for k, v in ref.state_dict().items()}, "epoch": 3}
    torch.save(wrapped, tmp_path / "w.pth")
    model = vitlab.load(tmp_path / "w.pth", num_heads=4)
    with torch.no_grad():
        assert_close_rel(model(images()), ref(images()))


def test_no_embed_class_layout(tmp_path):
    """DeiT-III-style pos_embed without a class row equals a zero class row."""
    ref = randomize(timm_vit.VisionTransformer(**TINY, no_embed_class=True))
    model = vitlab.load(save_state(ref.state_dict(), tmp_path / "n.pth"), num_heads=4)
    assert model.pos_embed.shape[1] == 17 and torch.all(model.pos_embed[0, 0] == 0)
    with torch.no_grad():
        assert_close_rel(model(images()), ref(images()))


def test_load_at_another_img_size_matches_timm_bicubic(tmp_path):
    from timm.layers import resample_abs_pos_embed

    ref = randomize(timm_vit.VisionTransformer(**TINY))
    model = vitlab.load(save_state(ref.state_dict(), tmp_path / "t.pth"), num_heads=4, img_size=48)
    want = resample_abs_pos_embed(
        ref.pos_embed.detach(), (6, 6), num_prefix_tokens=1, interpolation="bicubic", antialias=True
    )
    assert model.pos_embed.shape == (1, 37, 64)
    assert_close_rel(model.pos_embed.detach(), want, rtol=1e-6)
    assert model(images(size=48)).shape == (3, 7)


def test_new_num_classes_is_a_fresh_zero_head(tmp_path):
    ref = randomize(timm_vit.VisionTransformer(**TINY))
    model = vitlab.load(save_state(ref.state_dict(), tmp_path / "t.pth"), num_heads=4, num_classes=3)
    assert model.head.weight.shape == (3, 64)
    assert torch.all(model.head.weight == 0) and torch.all(model.head.bias == 0)
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, ref.blocks[1].mlp.fc2.weight, rtol=0, atol=0)
    feats = model.forward_head(model.forward_features(images()), pre_logits=True)
    assert_close_rel(feats, ref.forward_head(ref.forward_features(images()), pre_logits=True))


def test_timm_hub_config_beside_the_weights(tmp_path):
    """timm's Hub config.json says the pooling (token pooling with avg is otherwise invisible), heads and labels."""
    import json

    ref = randomize(timm_vit.VisionTransformer(**{**TINY, "num_classes": 3}, global_pool="avg", fc_norm=False))
    path = save_state(ref.state_dict(), tmp_path / "model.safetensors")
    hub_cfg = {
        "architecture": "vit_tiny_custom",
        "global_pool": "avg",
        "model_args": {"num_heads": 4},
        "pretrained_cfg": {"mean": [0.4, 0.4, 0.4], "std": [0.2, 0.2, 0.2], "label_names": ["a", "b", "c"]},
    }
    (tmp_path / "config.json").write_text(json.dumps(hub_cfg))
    for source in (path, tmp_path):  # the folder works as well as the file
        model = vitlab.load(source)
        c = model.config
        assert (c.pool, c.class_token, c.num_heads, c.mean, c.class_names) == (
            "gap",
            True,
            4,
            (0.4,) * 3,
            ["a", "b", "c"],
        )
        with torch.no_grad():
            assert_close_rel(model(images()), ref(images()))


@pytest.mark.parametrize(("layers", "patch"), [((), 8), ((1, 1), 1)])
def test_timm_hybrid_checkpoints(layers, patch):
    """Hybrids (Sec. 3.1), built as timm's vit_tiny_r_s16_p8 / vit_*_r26_s32 but small: the ResNet's
    stages are counted from the keys and the image size includes its stride."""
    from timm.models import vision_transformer_hybrid as tvh

    backbone = tvh._resnetv2(layers)
    ref = tvh._create_vision_transformer_hybrid(
        "vit_tiny_r_s16_p8_224",
        backbone=backbone,
        img_size=32,
        patch_size=patch,
        embed_dim=192,
        depth=1,
        num_heads=3,
        num_classes=5,
    )
    ref = randomize(ref)
    model = vitlab.load(dict(ref.state_dict()))
    c = model.config
    assert (c.hybrid_layers, c.patch_size, c.img_size, c.depth) == (layers, patch, (32, 32), 1)
    x = images(n=2)
    with torch.no_grad():
        want = ref(x)
        assert want.abs().max() > 0.1
        assert_close_rel(model(x), want)
