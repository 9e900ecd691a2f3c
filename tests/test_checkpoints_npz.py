"""Google .npz checkpoints (vit_jax and big_vision layouts) written from random timm models.

The writer below is the inverse of the documented layouts; it is itself checked
against timm's own npz reader, so a mistake in it cannot hide one in vitlab's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import vitlab
from conftest import assert_close_rel, slow_cases

timm_vit = pytest.importorskip("timm.models.vision_transformer")

TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, act_layer="gelu_tanh")
HEADS = 4


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def to_npz(model, path, *, layout: str, prefix: str = "", scan: bool = False, pre_logits=None) -> str:
    """Write a timm ViT as Google's arrays: HWIO conv, (in, out) dense, per-head q/k/v/out kernels."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    d = sd["patch_embed.proj.weight"].shape[0]
    a: dict[str, np.ndarray] = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,
        "head/bias": sd["head.bias"],
    }
    has_cls = "cls_token" in sd
    if has_cls:
        a["cls"] = sd["cls_token"]
    if layout == "vit_jax":
        a["Transformer/posembed_input/pos_embedding"] = sd["pos_embed"]
        mha, ln2, mlp = "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3"
    else:  # big_vision: no class row (the test zeroes it in the reference model)
        a["pos_embedding"] = sd["pos_embed"][:, 1:] if has_cls else sd["pos_embed"]
        mha, ln2, mlp = "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0"
    if pre_logits is not None:
        a["pre_logits/kernel"], a["pre_logits/bias"] = pre_logits[0].numpy().T, pre_logits[1].numpy()
    blocks = []
    depth = len(model.blocks)
    for i in range(depth):
        b = f"blocks.{i}."
        q, k, v = np.split(sd[b + "attn.qkv.weight"], 3)
        qb, kb, vb = np.split(sd[b + "attn.qkv.bias"], 3)
        blk = {"LayerNorm_0/scale": sd[b + "norm1.weight"], "LayerNorm_0/bias": sd[b + "norm1.bias"]}
        for name, wt, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            blk[f"{mha}/{name}/kernel"] = wt.T.reshape(d, HEADS, d // HEADS)
            blk[f"{mha}/{name}/bias"] = bias.reshape(HEADS, d // HEADS)
        blk[f"{mha}/out/kernel"] = sd[b + "attn.proj.weight"].T.reshape(HEADS, d // HEADS, d)
        blk[f"{mha}/out/bias"] = sd[b + "attn.proj.bias"]
        blk[f"{ln2}/scale"], blk[f"{ln2}/bias"] = sd[b + "norm2.weight"], sd[b + "norm2.bias"]
        for j in (0, 1):
            blk[f"{mlp}/Dense_{j}/kernel"] = sd[b + f"mlp.fc{j + 1}.weight"].T
            blk[f"{mlp}/Dense_{j}/bias"] = sd[b + f"mlp.fc{j + 1}.bias"]
        blocks.append(blk)
    a.update(backbone_arrays(sd))
    if scan:
        for name in blocks[0]:
            a[f"Transformer/encoderblock/{name}"] = np.stack([blk[name] for blk in blocks])
    else:
        for i, blk in enumerate(blocks):
            a.update({f"Transformer/encoderblock_{i}/{name}": arr for name, arr in blk.items()})
    np.savez(path, **{prefix + k: np.ascontiguousarray(v) for k, v in a.items()})
    return str(path)


_PROJ = {
    "downsample.conv.weight": "conv_proj/kernel",
    "downsample.norm.weight": "gn_proj/scale",
    "downsample.norm.bias": "gn_proj/bias",
}


def backbone_arrays(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A hybrid's ResNet in vit_jax names: conv_root, gn_root, block<i>/unit<j>/{conv,gn}<r>, conv_proj, gn_proj."""
    out = {}
    for k, v in sd.items():
        if not k.startswith("patch_embed.backbone."):
            continue
        rest = k.removeprefix("patch_embed.backbone.").removeprefix("stem.")
        m = re.fullmatch(r"stages\.(\d+)\.blocks\.(\d+)\.(.+)", rest)
        if m:
            unit, rest = f"block{int(m[1]) + 1}/unit{int(m[2]) + 1}/", m[3]
            name = _PROJ.get(rest) or re.sub(
                r"norm(\d)\.bias", r"gn\1/bias", re.sub(r"norm(\d)\.weight", r"gn\1/scale", rest)
            )
            name = re.sub(r"conv(\d)\.weight", r"conv\1/kernel", name)
        else:
            unit, name = (
                "",
                {"conv.weight": "conv_root/kernel", "norm.weight": "gn_root/scale", "norm.bias": "gn_root/bias"}[rest],
            )
        out[unit + name] = v.transpose(2, 3, 1, 0) if v.ndim == 4 else v
    return out


def tiny(seed: int = 0, **kw):
    m = randomize(timm_vit.VisionTransformer(**{**TINY, "num_classes": 6, **kw}), seed)
    return m


def images(size: int = 32) -> torch.Tensor:
    return torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(1))


def check(model, ref, size: int = 32):
    x = images(size)
    with torch.no_grad():
        want, got = ref(x), model(x)
    assert want.abs().max() > 0.1
    assert_close_rel(got, want)


CASES = [
    # (layout, prefix, scan, timm kwargs, expected pool)
    ("vit_jax", "", False, {}, "cls"),
    ("vit_jax", "opt/target/", False, {}, "cls"),
    ("vit_jax", "", False, {"global_pool": "avg", "class_token": False, "fc_norm": False}, "gap"),
    ("big_vision", "params/", False, {}, "cls"),
    ("big_vision", "params/", True, {}, "cls"),
    ("big_vision", "params/", True, {"global_pool": "avg", "class_token": False, "fc_norm": False}, "gap"),
]


@pytest.mark.parametrize(("layout", "prefix", "scan", "kwargs", "pool"), CASES)
def test_npz_parity(tmp_path, layout, prefix, scan, kwargs, pool):
    ref = tiny(**kwargs)
    if layout == "big_vision" and ref.cls_token is not None:
        with torch.no_grad():
            ref.pos_embed[:, 0] = 0  # big_vision adds no position embedding to the class token
    path = to_npz(ref, tmp_path / "m.npz", layout=layout, prefix=prefix, scan=scan)
    model = vitlab.load(path)
    c = model.config
    assert (c.act, c.posemb_resample, c.mean, c.std, c.num_heads, c.pool, c.num_classes) == (
        "gelu_tanh",
        "jax",
        (0.5,) * 3,
        (0.5,) * 3,
        4,
        pool,
        6,
    )
    check(model, ref)


@pytest.mark.parametrize(("layout", "prefix", "scan"), [("vit_jax", "", False), ("big_vision", "params/", True)])
def test_writer_agrees_with_timms_npz_reader(tmp_path, layout, prefix, scan):
    # timm reads big_vision position embeddings only for models without a class token
    kw = {} if layout == "vit_jax" else {"global_pool": "avg", "class_token": False, "fc_norm": False}
    ref = tiny(**kw)
    path = to_npz(ref, tmp_path / "m.npz", layout=layout, prefix=prefix, scan=scan)
    other = randomize(timm_vit.VisionTransformer(**{**TINY, "num_classes": 6, **kw}), seed=5)
    with torch.no_grad():
        timm_vit._load_weights(other, path)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(other.state_dict()[k], v, rtol=0, atol=1e-7, msg=k)


def test_i21k_pre_logits_become_the_mlp_head(tmp_path):
    ref = tiny()
    g = torch.Generator().manual_seed(3)
    w, b = 0.1 * torch.randn(64, 64, generator=g), 0.1 * torch.randn(64, generator=g)
    path = to_npz(ref, tmp_path / "i21k.npz", layout="vit_jax", prefix="opt/target/", pre_logits=(w, b))
    model = vitlab.load(path)
    assert model.config.head == "mlp"
    x = images()
    with torch.no_grad():
        feats = ref.forward_head(ref.forward_features(x), pre_logits=True)
        want = ref.head(torch.tanh(feats @ w.T + b))
        assert_close_rel(model(x), want)
        # fine-tuning as in the paper: drop the pre-logits, new zero head
        ft = vitlab.load(path, head="linear", num_classes=10)
        assert ft.config.head == "linear" and torch.all(ft.head.weight == 0)
        assert_close_rel(ft.forward_head(ft.forward_features(x), pre_logits=True), feats)


def test_jax_resampling_matches_scipy_zoom(tmp_path):
    from scipy import ndimage

    ref = tiny()
    model = vitlab.load(to_npz(ref, tmp_path / "m.npz", layout="vit_jax"), img_size=56)
    grid = ref.pos_embed[0, 1:].detach().numpy().reshape(4, 4, 64)
    want = ndimage.zoom(grid, (7 / 4, 7 / 4, 1), order=1).reshape(49, 64)
    got = model.pos_embed[0].detach().numpy()
    assert got.shape == (50, 64)
    assert_close_rel(got[1:], want, rtol=1e-6)
    np.testing.assert_array_equal(got[0], ref.pos_embed[0, 0].detach().numpy())
    assert model(images(56)).shape == (3, 6)


def test_act_override(tmp_path):
    ref = randomize(timm_vit.VisionTransformer(**{**TINY, "act_layer": "gelu", "num_classes": 6}))
    model = vitlab.load(to_npz(ref, tmp_path / "m.npz", layout="vit_jax"), act="gelu")
    check(model, ref)


def test_npz_that_is_not_a_vit(tmp_path):
    np.savez(tmp_path / "x.npz", weights=np.zeros(3))
    with pytest.raises(vitlab.CheckpointError, match="not a ViT .npz"):
        vitlab.load(tmp_path / "x.npz")
    np.savez(tmp_path / "o.npz", obj=np.array([{"a": 1}], dtype=object))
    with pytest.raises(vitlab.CheckpointError, match="pickle"):
        vitlab.load(tmp_path / "o.npz")


@pytest.mark.parametrize("layers", slow_cases([(), (1, 1)], {(1, 1)}))  # the ResNet stem: seconds
def test_hybrid_npz(tmp_path, layers):
    """R50+ViT-B_16.npz-style files: the BiT ResNet under conv_root / block<i>/unit<j>, 1x1 patches."""
    from timm.models import vision_transformer_hybrid as tvh

    ref = tvh._create_vision_transformer_hybrid(
        "vit_tiny_r_s16_p8_224",
        backbone=tvh._resnetv2(layers),
        img_size=32,
        patch_size=8 if not layers else 1,
        embed_dim=64,
        depth=1,
        num_heads=HEADS,
        num_classes=5,
        act_layer="gelu_tanh",
    )
    ref = randomize(ref)
    path = to_npz(ref, tmp_path / "r.npz", layout="vit_jax")
    other = randomize(
        tvh._create_vision_transformer_hybrid(
            "vit_tiny_r_s16_p8_224",
            backbone=tvh._resnetv2(layers),
            img_size=32,
            patch_size=8 if not layers else 1,
            embed_dim=64,
            depth=1,
            num_heads=HEADS,
            num_classes=5,
        ),
        seed=7,
    )
    with torch.no_grad():
        timm_vit._load_weights(other, path)  # the writer agrees with timm's reader
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(other.state_dict()[k], v, rtol=0, atol=1e-7, msg=k)
    model = vitlab.load(path)
    assert model.config.hybrid_layers == layers and model.config.img_size == (32, 32)
    x = images()[:2]
    with torch.no_grad():
        want = ref(x)
        assert want.abs().max() > 0.1
        assert_close_rel(model(x), want)
