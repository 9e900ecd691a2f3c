"""The paper's other models: the ResNet hybrid (Sec. 3.1) and Axial-ViT (Appendix D.6)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_rel
from vitlab.models import VisionTransformer, ViTConfig, create_model
from vitlab.models.hybrid import same_pad_amount

HYBRID_PARAMS = {
    "vit_r_ti16": 6_337_704,
    "vit_r26_s32": 36_431_912,
    "vit_r50_b16": 98_659_112,
    "vit_r50_l32": 328_994_856,
}


@pytest.mark.parametrize("name", list(HYBRID_PARAMS))
def test_hybrid_param_counts_match_official(name: str) -> None:
    with torch.device("meta"):
        model = create_model(name)
    assert model.num_params() == HYBRID_PARAMS[name]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [("vit_r_ti16", "vit_tiny_r_s16_p8_224"), ("vit_r26_s32", "vit_small_r26_s32_224")],
)
def test_hybrid_loads_timm_weights_and_matches_logits(ours: str, theirs: str) -> None:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ref = timm.create_model(theirs, img_size=64, num_classes=7).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model = create_model(ours, img_size=64, num_classes=7).eval()
    model.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert_close_rel(model(x), ref(x))


def test_same_padding_matches_tensorflow_rule() -> None:
    assert same_pad_amount(224, 7, 2) == (2, 3)  # TF pads more at the end
    assert same_pad_amount(5, 3, 1) == (1, 1)
    assert same_pad_amount(8, 1, 2) == (0, 0)


@pytest.mark.slow
def test_hybrid_grid_and_other_sizes() -> None:
    model = create_model("vit_r26_s32", img_size=64, num_classes=3, depth=1).eval()
    assert model.config.grid_size == (2, 2) and model.pos_embed.shape[1] == 5
    with torch.no_grad():
        assert model(torch.randn(1, 3, 96, 64)).shape == (1, 3)


AXIAL = dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=4, mlp_dim=128, num_classes=3)


def test_axial_block_has_row_and_column_halves() -> None:
    axial = create_model("axial_vit_b16", **AXIAL)
    plain = create_model("vit_b16", **AXIAL)
    block_params = sum(p.numel() for p in plain.blocks.parameters())
    assert sum(p.numel() for p in axial.blocks.parameters()) == 2 * block_params
    assert "blocks.0.row.attn.qkv.weight" in axial.state_dict()
    assert "blocks.1.col.mlp.fc2.bias" in axial.state_dict()


@pytest.mark.parametrize("class_token", [True, False])
def test_axial_attention_is_row_stochastic_and_local(class_token: bool) -> None:
    model = create_model("axial_vit_b16", **AXIAL, class_token=class_token, pool="cls" if class_token else "gap").eval()
    x = torch.randn(2, 3, 32, 48)  # grid 4 x 6
    with torch.no_grad():
        logits, attns = model(x, return_attention=True)
        assert_close_rel(logits, model(x))
    pre = int(class_token)
    assert attns[0].shape == (2, 4, pre + 24, pre + 24)
    assert torch.allclose(attns[0].sum(-1), torch.ones(2, 4, pre + 24), atol=1e-5)
    # one row pass alone: patch (r, c) only mixes patches of row r (and the class token)
    blk = model.blocks[0]
    with torch.no_grad():
        z = model.embed(x)
        cls = z[:, :pre] if pre else None
        _, _, a_row = blk._axis(blk.row, cls, z[:, pre:].reshape(2, 4, 6, 64), True)
    from vitlab.models.axial import _dense

    dense = _dense(a_row, 2, (4, 6), pre, along_rows=True)
    q = pre + 2 * 6 + 3  # patch (2, 3)
    allowed = set(range(pre + 12, pre + 18)) | ({0} if pre else set())
    nonzero = set(torch.nonzero(dense[0, 0, q]).flatten().tolist())
    assert nonzero <= allowed and len(nonzero) == len(allowed)


def test_training_step_runs_for_hybrid_and_axial() -> None:
    for model in (
        create_model("vit_r_ti16", img_size=32, depth=1, num_classes=3),
        VisionTransformer(**AXIAL, attention="axial"),
    ):
        loss = model(torch.randn(2, 3, 32, 32)).logsumexp(-1).mean()
        loss.backward()
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_an_axial_models_config_counts_both_halves_of_each_block() -> None:
    """An axial block is a row block and a column block: the arithmetic count (what the memory fit and the size check
    read before any module is built) counts both. Before: one, half the blocks' parameters."""
    cfg = ViTConfig(img_size=(16, 16), patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=48, attention="axial")
    model = VisionTransformer(cfg)
    assert cfg.num_params() == model.num_params() == sum(p.numel() for p in model.parameters())


def test_the_axial_names_train_by_name() -> None:
    """``vitlab models`` lists ``axial_vit_b16`` and ``axial_vit_b32`` (Appendix D.6) and ``create_model`` builds them,
    but ``vitlab train --model axial_vit_b32`` was refused ("'axial_vit_b32' is not a plain ViT name"): the training
    side reads names through ``model_config``, which did not know them. Now it does, as every registered name."""
    from vitlab.models.variants import model_config
    from vitlab.train.conf.arch import base_config
    from vitlab.train.conf.train_config import build_config

    for p in (16, 32):
        cfg = model_config(f"axial_vit_b{p}", img_size=64)
        assert (cfg.name, cfg.attention, cfg.patch_size, cfg.embed_dim) == (f"axial_vit_b{p}", "axial", p, 768)
        with torch.device("meta"):
            assert cfg == create_model(f"axial_vit_b{p}", img_size=64).config
        assert base_config(build_config({"model": f"axial_vit_b{p}", "data": "unused"})).attention == "axial"


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("vit_base_patch16_siglip_gap_224", {"pool": "gap", "class_token": False}),
        ("vit_small_patch14_reg4_dinov2", {"reg_tokens": 4, "init_values": 1e-5}),
        ("deit_tiny_distilled_patch16_224", {"dist_token": True}),
        ("vit_base_patch32_clip_quickgelu_224", {"act": "quick_gelu", "pre_norm": True}),
    ],
)
def test_a_timm_name_trains_the_architecture_it_names(name, fields) -> None:
    """``vitlab train --model vit_base_patch16_siglip_gap_224`` trained a plain ViT-B/16 (a class token, its pooling):
    the training side read timm's names through ``model_config``, which kept our variant and dropped what the name
    implies (SigLIP's pooling, DINOv2's registers and layer scale, DeiT's distillation token, CLIP's QuickGELU and
    pre-norm), where ``create_model`` builds them. Now both build the same architecture."""
    from vitlab.models.variants import model_config
    from vitlab.train.conf.arch import base_config
    from vitlab.train.conf.train_config import build_config

    trained = base_config(build_config({"model": name, "data": "unused"}))
    assert {k: getattr(trained, k) for k in fields} == fields
    with torch.device("meta"):
        built = create_model(name).config
    assert model_config(name) == built
