"""Architecture options with timm's parameter names: register tokens, layer scale, qk-norm and the
attention-pooling (MAP) head. Each: a timm model built random-initialised here loads with
``vitlab.load`` (the options inferred from the tensors) and gives the same logits (1e-5 of their
size); the speed paths stand aside for the options they do not implement and still serve the
plain config."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_close_rel
from vitlab import accel
from vitlab.errors import ConfigError
from vitlab.models import VisionTransformer, ViTConfig

timm = pytest.importorskip("timm")
timm_vit = pytest.importorskip("timm.models.vision_transformer")

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=7)
OURS = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7)


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if (name.endswith("weight") and p.ndim == 1) or name.endswith("gamma") else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def images(n: int = 3, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


CASES = {
    "registers": ({"reg_tokens": 4}, {"reg_tokens": 4}),
    "registers_avg": ({"reg_tokens": 2, "global_pool": "avg"}, {"reg_tokens": 2, "pool": "gap", "fc_norm": True}),
    "layer_scale": ({"init_values": 0.1}, {"init_values": 1e-5}),
    "qk_norm": ({"qk_norm": True}, {"qk_norm": True}),
    "map_siglip": ({"class_token": False, "global_pool": "map"}, {"pool": "map", "class_token": False}),
    "map_with_cls": ({"global_pool": "map"}, {"pool": "map", "class_token": True}),
    "dinov2_reg": (
        {"reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5},
        {"reg_tokens": 4, "init_values": 1e-5},
    ),
    "clip_pre_norm": (  # as timm's CLIP image towers
        {"pre_norm": True, "norm_layer": functools.partial(nn.LayerNorm, eps=1e-5)},
        {"pre_norm": True, "norm_eps": 1e-5},
    ),
    "all": (
        {"reg_tokens": 1, "init_values": 0.5, "qk_norm": True, "class_token": False, "global_pool": "map"},
        {"reg_tokens": 1, "qk_norm": True, "pool": "map", "class_token": False},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_timm_parity(case):
    timm_kwargs, inferred = CASES[case]
    ref = randomize(timm_vit.VisionTransformer(**TINY, **timm_kwargs))
    model = vitlab.load(dict(ref.state_dict()), num_heads=4)
    for field, value in inferred.items():
        assert getattr(model.config, field) == value, field
    x = images()
    with torch.no_grad():
        want = ref(x)
        assert want.abs().max() > 0.1
        assert_close_rel(model(x), want)
        assert_close_rel(
            model.forward_head(model.forward_features(x), pre_logits=True),
            ref.forward_head(ref.forward_features(x), pre_logits=True),
        )
    assert model.num_prefix_tokens == ref.num_prefix_tokens
    assert model.global_pool == ref.global_pool


@pytest.mark.parametrize("case", list(CASES))
def test_built_model_has_timms_parameters(case):
    """A vitlab model built with the options has exactly timm's parameter names and shapes, and
    the config's analytic parameter count is right."""
    timm_kwargs, _ = CASES[case]
    fields = {**OURS, **CASES[case][1]}
    fields.setdefault("init_values", timm_kwargs.get("init_values"))
    ref = timm_vit.VisionTransformer(**TINY, **{**timm_kwargs, "no_embed_class": False})
    model = VisionTransformer(ViTConfig(**fields))
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert model.config.num_params() == sum(p.numel() for p in model.parameters())


def test_layer_scale_starts_at_init_values_and_registers_differ():
    model = VisionTransformer(ViTConfig(**OURS, init_values=1e-4, reg_tokens=3))
    assert torch.all(model.blocks[1].ls2.gamma == 1e-4)
    assert model.reg_token.shape == (1, 3, 64) and model.reg_token.std() > 0
    assert {"reg_token", "cls_token", "pos_embed"} <= model.no_weight_decay()


@pytest.mark.parametrize("option", [{"init_values": 1e-5}, {"qk_norm": True}])
def test_fast_paths_stand_aside_for_options_they_do_not_implement(option):
    plain_cfg = ViTConfig(**OURS)
    fast_plain = vitlab.create_model("vit_ti16", **{**OURS, "embed_dim": 64})
    assert all(b.accelerable() for b in fast_plain.blocks)  # the plain config keeps its fast path
    assert accel.training_path(fast_plain.train()) != "autograd"
    ref = randomize(VisionTransformer(plain_cfg.replace(**option)))
    fast = accel.accelerate(VisionTransformer(plain_cfg.replace(**option)))
    fast.load_state_dict(ref.state_dict())
    assert type(fast.blocks[0]) is accel.FastBlock and not any(b.accelerable() for b in fast.blocks)
    assert accel.training_path(fast.train()) == "autograd"
    fast.eval()
    with torch.no_grad():
        assert_close_rel(fast(images()), ref(images()))


def test_map_head_fast_model_matches_plain():
    ref = randomize(VisionTransformer(ViTConfig(**OURS, pool="map", class_token=False)))
    fast = accel.accelerate(VisionTransformer(ViTConfig(**OURS, pool="map", class_token=False)))
    fast.load_state_dict(ref.state_dict())
    assert not fast.eval().cls_only_applies()
    with torch.no_grad():
        assert_close_rel(fast(images()), ref(images()))


def test_reset_classifier_with_map():
    model = VisionTransformer(ViTConfig(**OURS, pool="map", class_token=False))
    model.reset_classifier(3, "avg")
    assert model.attn_pool is None and model.config.pool == "gap" and model(images()).shape == (3, 3)
    with pytest.raises(ConfigError, match="map"):
        model.reset_classifier(3, "map")


def test_axial_refuses_registers():
    with pytest.raises(ConfigError, match="reg_tokens"):
        ViTConfig(**OURS, attention="axial", reg_tokens=2)


@pytest.mark.parametrize(
    "name",
    [
        "vit_small_patch14_dinov2",
        "vit_small_patch14_reg4_dinov2",
        "vit_base_patch16_siglip_224",
        "deit_tiny_patch16_224",
        "deit_tiny_distilled_patch16_224",
        "vit_base_patch32_clip_224",
        "vit_base_patch32_clip_quickgelu_224",
    ],
)
def test_timm_family_names_build_timms_architecture(name, tmp_path):
    """timm's family names give the same parameter names and shapes as timm's own model (one block)."""
    ref = timm.create_model(name, pretrained=False, depth=1)
    model = vitlab.create_model(name, depth=1)
    ours = {k: v.shape for k, v in model.state_dict().items()}
    theirs = {k: v.shape for k, v in ref.state_dict().items()}
    if ref.no_embed_class:  # ours keeps (zero) rows for the prefix tokens: what timm's layout loads into
        theirs["pos_embed"] = torch.Size([1, ref.num_prefix_tokens + theirs["pos_embed"][1], theirs["pos_embed"][2]])
    assert ours == theirs
    randomize(ref)  # and timm's weights load (the architecture inferred) with timm's outputs
    source = dict(ref.state_dict())
    if "quickgelu" in name:  # the activation is invisible in the weights: timm's Hub config.json names it
        torch.save(source, tmp_path / "model.pth")
        (tmp_path / "config.json").write_text(json.dumps({"architecture": name}))
        source = tmp_path / "model.pth"
    loaded = vitlab.load(source)
    x = torch.randn(1, 3, *ref.patch_embed.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close_rel(loaded(x), ref(x))
    assert model.config.img_size == tuple(ref.patch_embed.img_size)


def test_vitlab_folder_round_trip_keeps_the_options(tmp_path):
    cfg = ViTConfig(**OURS, reg_tokens=2, init_values=0.1, qk_norm=True, pool="map", class_token=False)
    model = randomize(VisionTransformer(cfg))
    vitlab.save(model, tmp_path / "m")
    back = vitlab.load(tmp_path / "m")
    assert (back.config.reg_tokens, back.config.init_values, back.config.qk_norm, back.config.pool) == (
        2,
        0.1,
        True,
        "map",
    )
    with torch.no_grad():
        assert_close_rel(back(images()), model(images()))


@pytest.fixture
def deit_distilled():
    from timm.models.deit import VisionTransformerDistilled

    return randomize(VisionTransformerDistilled(**TINY))


def test_deit_distilled_parity(deit_distilled):
    """DeiT's distillation token and head_dist load from timm; logits (mean of both heads), pre-logits
    and the two heads of distilled training match timm's."""
    ref = deit_distilled
    model = vitlab.load(dict(ref.state_dict()), num_heads=4)
    assert model.config.dist_token and model.num_prefix_tokens == 2
    assert not model.cls_only_applies()  # the fast class-token-only block would drop the distillation token
    x = images()
    with torch.no_grad():
        assert_close_rel(model(x), ref(x))
        assert_close_rel(
            model.forward_head(model.forward_features(x), pre_logits=True),
            ref.forward_head(ref.forward_features(x), pre_logits=True),
        )
    ref.set_distilled_training(True)
    model.set_distilled_training(True)
    ref.train(), model.train()
    with torch.no_grad():
        for got, want in zip(model(x), ref(x)):
            assert_close_rel(got, want)
    assert isinstance(model.get_classifier(), tuple)


def test_deit_distilled_new_classes_and_reset(deit_distilled):
    model = vitlab.load(dict(deit_distilled.state_dict()), num_heads=4, num_classes=3)
    assert model.head_dist.weight.shape == (3, 64) and torch.all(model.head_dist.weight == 0)
    model.reset_classifier(0)
    assert model(images()).shape == (3, 64)


def test_deit_distilled_name():
    ref = timm.create_model("deit_tiny_distilled_patch16_224", depth=1)
    model = vitlab.create_model("deit_tiny_distilled_patch16_224", depth=1)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert model.config.num_params() == sum(p.numel() for p in model.parameters())
    with pytest.raises(ConfigError, match="dist_token"):
        ViTConfig(**OURS, dist_token=True, pool="gap")
