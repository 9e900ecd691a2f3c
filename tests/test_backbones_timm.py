"""The backbones of timm's ``Eva`` class (EVA-02, DINOv3, the Perception Encoder, timm's and Naver's RoPE ViTs) and
SigLIP 2's towers: a tiny random-initialised timm model, saved as timm saves it, loads with ``vitlab.load`` (the
family told from its keys) and gives timm's logits to float32 rounding; ``vitlab.create_model`` builds timm's
parameters under timm's names; and what vitlab does not compute exactly is refused by name, never loaded."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_close_rel, slow_cases
from vitlab.checkpoints import families
from vitlab.errors import CheckpointError
from vitlab.models.variants import BACKBONES

timm = pytest.importorskip("timm")
safetensors_torch = pytest.importorskip("safetensors.torch")


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter drawn (norm weights and layer scales around 1), so that no option hides behind zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if (name.endswith("weight") and p.ndim == 1) or "gamma" in name else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def timm_model(name: str, **kw) -> nn.Module:
    return randomize(timm.create_model(name, pretrained=False, **kw))


def save(model: nn.Module, path) -> str:
    safetensors_torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def images(size: int, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


# name -> (timm's create_model arguments, the family vitlab names, vitlab.load overrides)
FAMILIES = {
    "eva02_tiny_patch14_224": (dict(depth=2, img_size=56), "EVA-02", {}),
    "eva02_base_patch14_224": (dict(depth=1, img_size=56, embed_dim=192, num_heads=3), "EVA-02", {}),
    "eva02_base_patch16_clip_224": (dict(depth=1, img_size=64, embed_dim=192, num_heads=3), "EVA-02", {}),
    "vit_small_patch16_dinov3": (dict(depth=2, img_size=64), "DINOv3", {}),
    "vit_small_patch16_dinov3_qkvb": (dict(depth=2, img_size=64), "DINOv3", {}),
    "vit_small_plus_patch16_dinov3": (dict(depth=1, img_size=48), "DINOv3", {}),
    "vit_huge_plus_patch16_dinov3_qkvb": (dict(depth=1, img_size=32, embed_dim=160, num_heads=5), "DINOv3", {}),
    "vit_pe_core_tiny_patch16_384": (dict(depth=2, img_size=64), "Perception Encoder (PE core)", {}),
    "vit_pe_core_base_patch16_224": (dict(depth=1, img_size=48), "Perception Encoder (PE core)", {}),
    "vit_pe_core_gigantic_patch14_448": (
        dict(depth=1, img_size=56, embed_dim=192, num_heads=3),
        "Perception Encoder (PE core)",
        {},
    ),
    "vit_medium_patch16_rope_reg1_gap_256": (
        dict(depth=1, img_size=64, embed_dim=192, num_heads=3),
        "timm's RoPE ViT (SBB)",
        {},
    ),
    "vit_small_patch16_rope_224": (dict(depth=1, img_size=64), "RoPE-ViT (Naver, axial)", {}),
    "vit_small_patch16_rope_ape_224": (dict(depth=1, img_size=64), "RoPE-ViT (Naver, axial)", {}),
    "vit_so400m_patch14_siglip_224": (dict(depth=1, img_size=56), "SigLIP", {}),
    "naflexvit_so400m_patch16_siglip": (dict(depth=1, img_size=256), "SigLIP 2 NaFlex", {}),
}


@pytest.mark.parametrize(
    "name",
    slow_cases(FAMILIES, {"vit_so400m_patch14_siglip_224", "naflexvit_so400m_patch16_siglip"}),  # width 1152
)
def test_family_loads_from_timms_safetensors_with_timms_logits(name, tmp_path):
    kw, family, overrides = FAMILIES[name]
    heads = {"num_heads": kw["num_heads"]} if "num_heads" in kw else {}
    ref = timm_model(name, num_classes=5, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every invisible field is known: no guess, no warning
        model = vitlab.load(save(ref, tmp_path / "model.safetensors"), **heads, **overrides)
    assert model.config.extra["family"] == family
    x = images(kw["img_size"])
    with torch.no_grad():
        want = ref(x)
        assert want.abs().max() > 0.1
        assert_close_rel(model(x), want)
        assert_close_rel(model.forward_features(x), ref.forward_features(x))


@pytest.mark.slow
def test_held_out_names_at_their_own_sizes(tmp_path):
    """The four names of the issue, at timm's widths (heads from the paper's table), two blocks: timm's logits."""
    for name, size in (
        ("eva02_tiny_patch14_224", 56),
        ("vit_small_patch16_dinov3", 32),
        ("vit_small_patch16_dinov3_qkvb", 32),
        ("vit_pe_core_tiny_patch16_384", 64),
    ):
        ref = timm_model(name, depth=2, img_size=size)
        model = vitlab.load(save(ref, tmp_path / f"{name}.safetensors"))
        with torch.no_grad():
            assert_close_rel(model(images(size)), ref(images(size)), msg=name)


def test_pe_core_no_longer_loads_as_a_near_miss(tmp_path):
    """PE core's keys are those of a pre-norm ViT with attention pooling: before, vitlab took it for one (1e-3
    off timm). Its RoPE, its pooling over every token with 8 heads and its eps now make it exact."""
    ref = timm_model("vit_pe_core_tiny_patch16_384", depth=2, img_size=64)
    model = vitlab.load(save(ref, tmp_path / "pe.safetensors"))
    cfg = model.config
    assert (cfg.rope, cfg.rope_kind, cfg.rope_ref_grid, cfg.rope_offset) == (True, "pe", (24, 24), 1.0)
    assert (cfg.pool, cfg.pool_include_prefix, cfg.map_heads, cfg.norm_eps) == ("map", True, 8, 1e-5)
    plain = vitlab.models.VisionTransformer(cfg.replace(rope=False, rope_kind="axial", rope_ref_grid=None))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain.eval()(images(64)) - ref(images(64))).abs().max() > 1e-4  # RoPE is no detail


def test_hub_config_names_what_the_weights_cannot(tmp_path):
    """A PE core base of another width: its 14x14 RoPE grid comes from timm's config.json, not from a guess."""
    ref = timm_model("vit_pe_core_base_patch16_224", depth=1, img_size=32, embed_dim=64, num_heads=4)
    save(ref, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "vit_pe_core_base_patch16_224.fb"}))
    model = vitlab.load(tmp_path / "model.safetensors", num_heads=4)
    assert model.config.rope_ref_grid == (14, 14)
    with torch.no_grad():
        assert_close_rel(model(images(32)), ref(images(32)))
    with pytest.warns(UserWarning, match="rope_ref_grid"):  # without it: PE core T/S/L's grid, said aloud
        vitlab.load(dict(ref.state_dict()), num_heads=4)


@pytest.mark.parametrize(
    ("name", "kw", "missing"),
    [
        ("vit_pe_spatial_tiny_patch16_512", dict(img_size=64), "spatial or language tower"),
        ("vit_small_patch16_rope_mixed_224", dict(img_size=64), "RoPE-Mixed"),
        ("eva_giant_patch14_224", dict(img_size=56, embed_dim=64, num_heads=4), "EVA-01 or EVA-02-E"),
    ],
)
def test_families_vitlab_does_not_compute_are_refused_by_name(name, kw, missing, tmp_path):
    ref = timm.create_model(name, pretrained=False, depth=1, **kw)
    with pytest.raises(CheckpointError, match=missing):
        vitlab.load(save(ref, tmp_path / "model.safetensors"))


def test_an_eva_layout_of_no_known_family_is_refused():
    ref = timm_model("vit_small_patch16_dinov3", depth=1, img_size=32)
    state = {k: v for k, v in ref.state_dict().items() if k != "norm.weight" and k != "norm.bias"}
    state["fc_norm.weight"], state["fc_norm.bias"] = torch.ones(384), torch.zeros(384)
    state["pos_embed"] = torch.zeros(1, 4, 384)
    with pytest.raises(CheckpointError, match="of no family vitlab recognises"):
        vitlab.load(state)


@pytest.mark.parametrize(
    "name",
    [
        "eva02_tiny_patch14_224",
        "eva02_large_patch14_clip_224",
        "vit_base_patch16_dinov3",
        "vit_small_plus_patch16_dinov3_qkvb",
        "vit_7b_patch16_dinov3",
        "vit_pe_core_small_patch16_384",
        "vit_pe_core_gigantic_patch14_448",
        "vit_giantopt_patch16_siglip_gap_256",
        "vit_base_patch16_siglip_gap_224",
        "vit_base_patch32_siglip_256",
        "naflexvit_so400m_patch16_siglip",
    ],
)
def test_create_model_builds_timms_architecture(name):
    """timm's name builds timm's parameters (timm's names through :func:`families.to_eva`), counted right,
    at timm's input size and with timm's head, on the meta device (the 7B too)."""
    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, depth=2)
        model = vitlab.create_model(name, depth=2)
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    layout = "split_qkv" if "attn.q_proj.weight" in str(list(theirs)) else ""
    packed = any(
        k.endswith("mlp.fc1.weight") and v[0] == 2 * theirs[k.replace("fc1", "fc2")][1] for k, v in theirs.items()
    )
    ours = families.to_eva(model.state_dict(), split_qkv=bool(layout), packed_glu=packed)
    if name.startswith("naflexvit_"):
        ours = families.to_naflex(ours, model.config.grid_size)
    assert {k: tuple(v.shape) for k, v in ours.items()} == theirs
    assert model.config.num_params() == model.num_params() == sum(p.numel() for p in ref.parameters())
    if not name.startswith("naflexvit_"):  # (NaFlex: any size; vitlab's is its table's, 256 px, timm's 384)
        assert model.config.img_size == tuple(ref.pretrained_cfg["input_size"][1:])
    assert model.config.num_classes == ref.num_classes
    if name in BACKBONES:  # (the others are aliases of vitlab's Table 1 names)
        assert vitlab.models.resolve_name(f"{name}.some_tag") == name


def test_models_command_lists_the_backbones_with_parameter_counts(capsys):
    from vitlab.cli import main

    assert main(["models", "*dinov3*", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["vit_small_patch16_dinov3"]["kind"] == "architecture"
    assert rows["vit_small_patch16_dinov3"]["params"] == vitlab.create_model("vit_small_patch16_dinov3").num_params()
    assert rows["vit_7b_patch16_dinov3"]["params"] > 6e9
    assert main(["models", "eva02_*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("eva02_large_patch14_clip_336 "))
    assert len(row) == len(next(line for line in lines if line.startswith("eva02_tiny_patch14_224 ")))  # aligned


@pytest.mark.parametrize(
    "option",
    [
        {"key_bias": False},
        {"mlp": "swiglu"},
        {"mlp_norm": True},
        {"attn_norm": True},
        {"rope": True, "rope_kind": "dinov3", "posemb": "none"},
    ],
)
def test_speed_paths_stand_aside_for_the_backbones_options(option):
    """q/v-only biases are parameters of the attention, not submodules: the speed paths, which read
    ``attn.qkv.bias`` alone, must see them and stand aside, as for the options that add submodules."""
    from vitlab import accel
    from vitlab.models import VisionTransformer, ViTConfig

    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=7, **option)
    ref = randomize(VisionTransformer(cfg))
    fast = accel.accelerate(VisionTransformer(cfg))
    fast.load_state_dict(ref.state_dict())
    assert not any(b.accelerable() for b in fast.blocks) and not fast.eval().cls_only_applies()
    with torch.no_grad():
        assert_close_rel(fast(images(32, 3)), ref(images(32, 3)))
    assert accel.training_path(fast.train()) == "autograd"


def test_npz_layouts_refuse_the_backbones_options(tmp_path):
    from vitlab.checkpoints.npz_write import write_npz
    from vitlab.errors import ConfigError

    model = vitlab.create_model("vit_small_patch16_dinov3_qkvb", depth=1)
    with pytest.raises(ConfigError, match="reg_tokens|init_values|mlp|key_bias"):
        write_npz(model, tmp_path / "m.npz", layout="big_vision")


def test_siglip2_naflex_tower_at_any_size_and_packed(tmp_path):
    """SigLIP 2's NaFlex tower (timm's NaFlexVit): its linear patch embedding is Eq. 1's convolution and its 16x16
    table is resampled bilinearly to each image's grid, so vitlab gives timm's logits at any size and aspect
    ratio, and for images of several shapes packed in one sequence (NaViT); timm's layout is written back."""
    from vitlab.checkpoints.layouts import write_layout
    from vitlab.models.packed import pack, patchify

    ref = timm_model("naflexvit_base_patch16_siglip", depth=2, embed_dim=64, num_heads=4, num_classes=5)
    model = vitlab.load(save(ref, tmp_path / "model.safetensors"), num_heads=4)
    assert model.config.extra["family"] == "SigLIP 2 NaFlex" and model.config.act == "gelu_tanh"
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(3, 64, 96, generator=g), torch.randn(3, 32, 160, generator=g)
    with torch.no_grad():
        for x in (images(256), images(384), a[None]):
            assert_close_rel(model(x), ref(x))
        packed = pack([[patchify(a, 16), patchify(b, 16)]], seq_len=60, prefix_tokens=0)
        assert_close_rel(model(packed), torch.cat([ref(a[None]), ref(b[None])]))
    out, _ = write_layout(model, tmp_path / "back.safetensors", layout="timm")
    again = timm.create_model("naflexvit_base_patch16_siglip", depth=2, embed_dim=64, num_heads=4, num_classes=5)
    again.load_state_dict(safetensors_torch.load_file(str(out)), strict=True)


def _readme_families() -> list[str]:
    """The first column of README's family table."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text()
    table = text.split("| Family | timm names `create_model` accepts |", 1)[1].split("\n\n", 1)[0]
    return [row.split("|")[1].strip() for row in table.strip().splitlines()[2:]]  # (after the header's rest, ---)


def _hybrid() -> nn.Module:
    from timm.models import vision_transformer_hybrid as tvh

    return tvh._create_vision_transformer_hybrid(
        "vit_tiny_r_s16_p8_224", backbone=tvh._resnetv2((1, 1)), img_size=32, patch_size=1, embed_dim=192, depth=1,
        num_heads=3, num_classes=5,
    )  # fmt: skip


# README's family -> (a tiny timm model of it, its input size)
README_FAMILIES = {
    "ViT / AugReg / original": (lambda: timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32), 32),
    "Hybrid ViT": (_hybrid, 32),
    "DeiT": (lambda: timm.create_model("deit_tiny_patch16_224", depth=1, img_size=32), 32),
    "DeiT distilled": (lambda: timm.create_model("deit_tiny_distilled_patch16_224", depth=1, img_size=32), 32),
    "DINOv2": (lambda: timm.create_model("vit_small_patch14_reg4_dinov2", depth=1, img_size=28), 28),
    "SigLIP image tower": (lambda: timm.create_model("vit_base_patch16_siglip_224", depth=1, img_size=32), 32),
    "CLIP image tower": (lambda: timm.create_model("vit_base_patch32_clip_224", depth=1, img_size=64), 64),
    "qk-norm models": (lambda: timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32, qk_norm=True), 32),
    "EVA-02": (lambda: timm.create_model("eva02_tiny_patch14_224", depth=1, img_size=28), 28),
    "DINOv3": (lambda: timm.create_model("vit_small_plus_patch16_dinov3_qkvb", depth=1, img_size=32), 32),
    "Perception Encoder (PE core)": (
        lambda: timm.create_model("vit_pe_core_small_patch16_384", depth=1, img_size=32),
        32,
    ),
    "SigLIP 2 image tower": (lambda: timm.create_model("naflexvit_base_patch16_siglip", depth=1), 48),
    "RoPE ViTs of timm and Naver": (lambda: timm.create_model("vit_small_patch16_rope_224", depth=1, img_size=32), 32),
}


@pytest.mark.slow
def test_every_family_of_the_readme_table_loads_with_timms_outputs(tmp_path):
    """Each row of README's family table: a tiny timm model of it, saved as safetensors, loads with timm's logits
    (a row without a check here fails: the table says nothing this test does not hold)."""
    assert _readme_families() == list(README_FAMILIES)
    for family, (build, size) in README_FAMILIES.items():
        torch.manual_seed(0)
        ref = randomize(build())
        model = vitlab.load(save(ref, tmp_path / "model.safetensors"))
        x = images(size)
        with torch.no_grad():
            assert_close_rel(model(x), ref(x), msg=family)


@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3_qkvb", "eva02_tiny_patch14_224"])
def test_token_dropping_with_rope_is_timms(name):
    """Token dropping (PatchDropout) in training: each kept patch is rotated by its own place, as timm does
    (``apply_keep_indices_nlc``); with the same draws, timm's training logits. Before: a shape error."""
    kw = {"depth": 2, "img_size": 64 if "dinov3" in name else 56}
    ref = timm_model(name, num_classes=5, patch_drop_rate=0.5, **kw).train()
    model = vitlab.load(dict(ref.state_dict()), patch_drop_rate=0.5).train()
    x = images(kw["img_size"], 3)
    torch.manual_seed(5)
    want = ref(x)
    torch.manual_seed(5)
    got = model(x)
    assert_close_rel(got, want)
    got.sum().backward()
