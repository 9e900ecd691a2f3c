"""The model of Eq. 1-4: parameter counts, timm parity, options, attention, errors."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import assert_close_rel
from vitlab import ConfigError, InputError, UnknownModelError, VisionTransformer, ViTConfig, create_model
from vitlab.models import list_models

OFFICIAL_PARAMS = {
    "vit_ti16": 5_717_416,
    "vit_s16": 22_050_664,
    "vit_s32": 22_878_952,
    "vit_b8": 86_576_872,
    "vit_b16": 86_567_656,
    "vit_b32": 88_224_232,
    "vit_l16": 304_326_632,
    "vit_l32": 306_535_400,
    "vit_h14": 632_045_800,
}

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=5)


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.mark.parametrize("name", list(OFFICIAL_PARAMS))
def test_param_counts_match_official(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name)
    assert model.num_params() == OFFICIAL_PARAMS[name]


def test_gap_without_class_token_count() -> None:
    with torch.device("meta"):
        model = create_model("vit_b16", pool="gap", class_token=False)
    assert model.num_params() == 86_566_120


@pytest.mark.slow
def test_registered_config_is_the_config_create_model_builds(monkeypatch) -> None:
    """``vitlab models`` lists every name from ``registered_config`` and the config's arithmetic, building nothing:
    for every registered name (and every fifth with another head and resolution), the same config as the model
    ``create_model`` builds and the same parameter and MAC counts. A name registered with a builder alone is built on
    the meta device."""
    from vitlab.models import count_macs, registered_config

    names = list_models()
    for name, kw in [*((n, {}) for n in names), *((n, {"num_classes": 10, "img_size": 448}) for n in names[::5])]:
        with torch.device("meta"):
            model = create_model(name, **kw)
        cfg = registered_config(name, **kw)
        assert cfg == model.config, name
        assert cfg.num_params() == model.num_params() and count_macs(cfg) == model.macs(), name
    from vitlab.models import registry

    monkeypatch.delitem(registry._CONFIGS, "vit_ti16")  # as a name registered with a builder alone
    assert registered_config("vit_ti16", img_size=64) == create_model("vit_ti16", img_size=64).config


def test_names_and_aliases() -> None:
    names = list_models()
    assert {"vit_ti16", "vit_b16", "vit_h14"} <= set(names)
    with torch.device("meta"):
        a = create_model("B/16")
        b = create_model("ViT-L/32")
    assert a.config.embed_dim == 768 and a.config.patch_size == 16
    assert b.config.depth == 24 and b.config.patch_size == 32


def test_unknown_name_suggests_close() -> None:
    with pytest.raises(UnknownModelError, match="did you mean.*vit_b16"):
        create_model("vit_b61")
    assert "vit_b61" in str(UnknownModelError("unknown model 'vit_b61'"))


@pytest.mark.parametrize("kind", ["cls", "gap", "gap_fc_norm"])
def test_logits_match_timm(kind: str) -> None:
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    common = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, num_classes=5)
    if kind == "cls":
        ref = timm_vit.VisionTransformer(**common)
        ours = VisionTransformer(**TINY)
    elif kind == "gap":
        ref = timm_vit.VisionTransformer(**common, global_pool="avg", class_token=False, fc_norm=False)
        ours = VisionTransformer(**TINY, pool="gap", class_token=False)
    else:
        ref = timm_vit.VisionTransformer(**common, global_pool="avg", fc_norm=True)
        ours = VisionTransformer(**TINY, pool="gap", fc_norm=True)
    _randomise(ref).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    ours.eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert_close_rel(ours(x), ref(x))


def test_return_attention_is_exact_and_complete() -> None:
    model = _randomise(VisionTransformer(**TINY)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        fast = model(x)
        logits, attns = model(x, return_attention=True)
        with model.capture_attention() as captured:
            model(x)
    assert_close_rel(logits, fast)
    assert len(attns) == len(captured) == 2
    for a, c in zip(attns, captured):
        assert a.shape == (2, 4, 17, 17)
        assert torch.allclose(a.sum(-1), torch.ones(2, 4, 17), atol=1e-5)
        assert torch.equal(a, c)
    # the first layer's weights equal softmax(q k^T / sqrt(d)) written out by hand
    blk = model.blocks[0]
    with torch.no_grad():
        z = blk.norm1(model.embed(x))
        q, k, _ = blk.attn.qkv(z).view(2, 17, 3, 4, 16).permute(2, 0, 3, 1, 4)
        manual = (q @ k.transpose(-1, -2) / 4.0).softmax(-1)
    assert torch.allclose(attns[0], manual, atol=1e-6)


def test_forward_intermediates() -> None:
    model = _randomise(VisionTransformer(**TINY)).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model.forward_intermediates(x)
        logits = model(x)
    assert out["stem"].shape == (1, 16, 64)
    assert out["embedded"].shape == (1, 17, 64)
    assert len(out["blocks"]) == 2 and len(out["attention"]) == 2
    assert_close_rel(out["logits"], logits)


@pytest.mark.parametrize("posemb", ["learn", "learn2d", "sincos2d", "none"])
@pytest.mark.parametrize("pool", ["cls", "gap", "seq"])
def test_options_build_train_and_run_at_other_sizes(posemb: str, pool: str) -> None:
    model = VisionTransformer(
        **TINY, posemb=posemb, pool=pool, head="mlp", representation_size=32, act="gelu_tanh", drop_path_rate=0.1
    )
    out = model(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 5)
    assert model.patch_embed.proj.weight.grad is not None
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 48, 64)).shape == (1, 5)
    if posemb == "learn2d":
        assert model.pos_embed_row.shape == (1, 4, 32) and model.pos_embed_col.shape == (1, 4, 32)
    if posemb != "learn":
        assert not hasattr(model, "pos_embed")


def test_learn2d_is_concatenation_of_row_and_column() -> None:
    model = _randomise(VisionTransformer(**TINY, posemb="learn2d"))
    pe = model.patch_posemb((4, 4))
    assert pe.shape == (1, 16, 64)
    # patch (r, c) = 2 * 4 + 3 -> row 2's first half, column 3's second half
    assert torch.equal(pe[0, 11, :32], model.pos_embed_row[0, 2])
    assert torch.equal(pe[0, 11, 32:], model.pos_embed_col[0, 3])


def test_head_is_zero_initialised_and_mlp_head_has_pre_logits() -> None:
    model = VisionTransformer(**TINY)
    assert torch.count_nonzero(model.head.weight) == 0
    mlp = VisionTransformer(**TINY, head="mlp", representation_size=48)
    assert mlp.pre_logits.fc.weight.shape == (48, 64)
    assert mlp.head.weight.shape == (5, 48)
    feats = mlp.forward_head(torch.randn(2, 17, 64), pre_logits=True)
    assert feats.shape == (2, 48) and feats.abs().max() <= 1.0  # tanh


def test_patch_embedding_equals_flattened_patch_projection() -> None:
    """Eq. 1: x_p E with x_p the row-major flattened P x P x C patches."""
    model = _randomise(VisionTransformer(**TINY))
    x = torch.randn(2, 3, 32, 32)
    p = 8
    patches = x.unfold(2, p, p).unfold(3, p, p)  # B, C, gh, gw, P, P
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(2, 16, 3 * p * p)
    w = model.patch_embed.proj.weight.reshape(64, -1)
    expected = patches @ w.T + model.patch_embed.proj.bias
    assert_close_rel(model.patch_embed(x), expected)


def test_no_weight_decay_names() -> None:
    assert VisionTransformer(**TINY).no_weight_decay() == {"pos_embed", "cls_token"}
    assert VisionTransformer(**TINY, posemb="learn2d").no_weight_decay() == {
        "pos_embed_row",
        "pos_embed_col",
        "cls_token",
    }


def test_config_json_round_trip() -> None:
    cfg = ViTConfig(**TINY, class_names=list("abcde"), posemb="learn2d", extra={"source": "test"})
    again = ViTConfig.from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(cfg.to_json())["img_size"] == [32, 32]


def test_loading_state_dict_at_other_resolution_resamples() -> None:
    small = _randomise(VisionTransformer(**TINY))
    big = VisionTransformer(**{**TINY, "img_size": 64})
    big.load_state_dict(small.state_dict())
    assert big.pos_embed.shape == (1, 65, 64)
    assert torch.equal(big.pos_embed[:, 0], small.pos_embed[:, 0])  # class row kept


def test_vit_is_one_class_that_loads_other_resolutions_itself() -> None:
    """The model is one ``nn.Module`` class in ``models/vit.py`` (files split by concern, not by line count: no
    mixins), and loading a checkpoint trained at another resolution (Sec. 3.2) is its own method there: the hook
    ``load_state_dict`` calls resamples E_pos in 2-D to the model's grid."""
    from vitlab.models import posemb, vit

    assert vit.VisionTransformer.__mro__[1:] == (torch.nn.Module, object)
    for name in ("_load_from_state_dict", "adapt_state_dict"):
        method = vit.VisionTransformer.__dict__[name]
        assert (method.__module__, method.__qualname__) == ("vitlab.models.vit", f"VisionTransformer.{name}")
    small = _randomise(vit.VisionTransformer(**TINY))  # a 4 x 4 grid
    big = vit.VisionTransformer(**{**TINY, "img_size": 48})  # 6 x 6
    big.load_state_dict(small.state_dict())
    want = posemb.resample_posemb(
        small.pos_embed.detach(), (6, 6), old_grid=(4, 4), num_prefix_tokens=1, mode=big.config.posemb_resample
    )
    assert torch.equal(big.pos_embed.detach(), want)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(img_size=30), "img_size: 30x30 is not divisible by the patch size 8"),
        (dict(num_heads=5), "num_heads: the width 64 is not divisible by 5 heads"),
        (dict(pool="max"), "pool: 'max' is not one of cls, gap"),
        (dict(class_token=False), "pool: 'cls' pooling needs class_token=True"),
        (dict(depth=0), "depth: must be positive"),
        (dict(drop_path_rate=1.5), r"drop_path_rate: must be in \[0, 1\)"),
        (dict(bogus=1), "unknown ViTConfig option"),
    ],
)
def test_bad_config_names_the_option(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        VisionTransformer(**{**TINY, **kwargs})


def test_bad_inputs_get_clear_errors() -> None:
    model = VisionTransformer(**TINY).eval()
    with pytest.raises(InputError, match="takes 3-channel images, got 1 channels"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(InputError, match="not divisible by the patch size 8.*dynamic_img_pad=True"):
        model(torch.randn(1, 3, 30, 32))
    with pytest.raises(InputError, match=r"shape \(B, C, H, W\)"):
        model(torch.randn(3, 32, 32))


def test_dynamic_pad_accepts_any_size() -> None:
    model = VisionTransformer(**TINY, dynamic_img_pad=True).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 30, 27)).shape == (1, 5)


def test_any_in_chans() -> None:
    model = VisionTransformer(**TINY, in_chans=1)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 5)


def test_macs_b16() -> None:
    with torch.device("meta"):
        model = create_model("vit_b16")
    assert round(model.macs() / 1e9, 1) == 17.6  # timm / fvcore report 17.6 GMACs


def test_sincos_table_under_compile_is_computed_not_cached() -> None:
    """Under ``torch.compile`` the fixed sine-cosine table is computed in the graph rather than read through the
    cache, which dynamo would trace through with a warning; the two tables are the same."""
    import warnings
    from unittest import mock

    from vitlab.models.posemb import patch_posemb_table

    like = torch.zeros(1)
    cached = patch_posemb_table(like, (3, 4), "sincos2d", (3, 4), "bicubic", 1, 16)
    with (
        mock.patch("torch.compiler.is_compiling", return_value=True),
        mock.patch("vitlab.models.posemb._sincos", side_effect=AssertionError("the cache was read")),
    ):
        assert torch.equal(patch_posemb_table(like, (3, 4), "sincos2d", (3, 4), "bicubic", 1, 16), cached)
    torch._dynamo.reset()
    torch._dynamo.utils.warn_once_cache.clear()  # dynamo warns once a process: an earlier test may have seen it
    model = VisionTransformer(**TINY, posemb="sincos2d", pool="gap").eval()
    x = torch.randn(2, 3, 32, 32)
    with warnings.catch_warnings(record=True) as seen, torch.no_grad():
        warnings.simplefilter("always")
        out = torch.compile(model, backend="eager")(x)
        assert_close_rel(out, model(x))
    assert not [w for w in seen if "lru_cache" in str(w.message)]
