"""Attention health (vitlab.inspect.health): known answers on hand-built models, invariants on random ones,
and the promise that measuring leaves the model, its modes and the random state as they were."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vitlab
from vitlab.accel.switch import hooks_anywhere
from vitlab.errors import ConfigError, InputError
from vitlab.inspect import attention_entropy, attention_health
from vitlab.models import VisionTransformer
from vitlab.models.rope import apply_rope


def _plain(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    cfg = {"img_size": 16, "patch_size": 4, "embed_dim": 8, "depth": 1, "num_heads": 2, "mlp_dim": 16}
    return VisionTransformer(**{**cfg, "num_classes": 3, **kw})


def _images(n: int = 2, size: int = 16) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _set_qk(model: VisionTransformer, q_bias: torch.Tensor, k_bias: torch.Tensor) -> None:
    """Zero query and key weights, so every token's query is ``q_bias`` and every key ``k_bias``."""
    d = model.config.embed_dim
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight[: 2 * d].zero_()
            blk.attn.qkv.bias[:d] = q_bias
            blk.attn.qkv.bias[d : 2 * d] = k_bias


def _mean_grid_distance(gh: int, gw: int, px: float) -> float:
    centers = [(r, c) for r in range(gh) for c in range(gw)]
    return sum(px * math.dist(p, q) for p in centers for q in centers) / len(centers) ** 2


# -- known answers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pool", "reg"), [("cls", 0), ("gap", 0), ("cls", 2)])
def test_uniform_attention_gives_log_t_entropy_grid_distance_and_the_bias_logit(pool, reg):
    # Zero q/k weights: every logit is the same number q_b . k_b / sqrt(D_h), so attention is uniform.
    m = _plain(pool=pool, class_token=pool == "cls", reg_tokens=reg)
    a, b = 0.5, -3.0
    _set_qk(m, torch.full((8,), a), torch.full((8,), b))
    h = attention_health(m, _images())
    t = (1 if pool == "cls" else 0) + reg + 16
    assert h["tokens"] == t and h["grid"] == [4, 4] and h["pixels_per_patch"] == 4.0
    assert h["layers"] == 1 and h["heads"] == 2 and h["num_images"] == 2
    assert h["max_entropy"] == pytest.approx(math.log(t), rel=1e-12)
    assert h["entropy"][0] == pytest.approx(math.log(t), rel=1e-6)
    assert h["entropy_per_head"][0] == pytest.approx([math.log(t)] * 2, rel=1e-6)
    assert h["collapsed_fraction"] == [0.0]
    want = _mean_grid_distance(4, 4, 4.0)
    assert h["uniform_distance"] == pytest.approx(want, rel=1e-9)
    assert h["distance"][0] == pytest.approx(want, rel=1e-5)
    head_dim = 4
    assert h["max_logit"][0] == pytest.approx(head_dim * a * b / math.sqrt(head_dim), rel=1e-6)
    json.dumps(h, allow_nan=False)


def test_collapse_threshold_above_log_t_counts_every_head():
    m = _plain()
    _set_qk(m, torch.zeros(8), torch.zeros(8))
    h = attention_health(m, _images(), collapse_threshold=math.log(17) + 0.01)
    assert h["collapsed_fraction"] == [1.0]
    assert h["max_logit"] == [0.0]
    with pytest.raises(ConfigError, match="collapse_threshold"):
        attention_health(m, _images(), collapse_threshold=-1.0)


def test_peaked_attention_collapses_and_its_logit_is_read_after_qk_norm():
    # Query = key = +-a per channel: every token's logit with itself and the rest is a^2 sqrt(D_h).
    pattern = torch.tensor([1.0, -1.0] * 4)
    m = _plain()
    _set_qk(m, 10 * pattern, 10 * pattern)
    h = attention_health(m, _images())
    assert h["max_logit"][0] == pytest.approx(100 * math.sqrt(4), rel=1e-6)
    # qk-norm: the same biases normalised to unit-variance +-1 channels first: the logit is sqrt(D_h).
    mq = _plain(qk_norm=True)
    _set_qk(mq, 10 * pattern, 10 * pattern)
    hq = attention_health(mq, _images())
    assert hq["max_logit"][0] == pytest.approx(math.sqrt(4), rel=1e-4)


def test_a_head_on_one_token_collapses_and_entropy_of_known_rows():
    eye = torch.eye(5).expand(2, 3, 5, 5)
    assert attention_entropy(eye).tolist() == [0.0, 0.0, 0.0]
    half = torch.zeros(1, 1, 4, 4)
    half[..., :2] = 0.5
    assert attention_entropy(half).tolist() == pytest.approx([math.log(2)], rel=1e-12)


@torch.no_grad()
def _reference_max_logits(model: VisionTransformer, x: torch.Tensor) -> list[float]:
    """Each block's largest q.k / sqrt(D_h), recomputed from its weights and input (an independent path)."""
    out = model.eval().forward_intermediates(x)
    inputs = [out["embedded"], *out["blocks"][:-1]]
    grid = model.grid(x)
    res = []
    for blk, z in zip(model.blocks, inputs):
        attn = blk.attn
        b, n, _ = z.shape
        qkv = attn.qkv(blk.norm1(z)).view(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
        if model.config.rope:
            cos, sin = attn.rope.table(grid)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        res.append(float(((q * attn.scale) @ k.transpose(-2, -1)).max()))
    return res


@pytest.mark.parametrize(
    "kw",
    [{}, {"qk_norm": True}, {"rope": True, "posemb": "none", "reg_tokens": 1}, {"pool": "gap", "class_token": False}],
    ids=["plain", "qk_norm", "rope_registers", "gap"],
)
def test_max_logit_matches_the_logits_recomputed_from_the_weights(kw):
    m = _plain(depth=2, **kw)
    with torch.no_grad():  # sharper attention than the initialisation gives
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(4)
    x = _images()
    h = attention_health(m, x)
    want = _reference_max_logits(m, x)
    assert h["max_logit"] == pytest.approx(want, rel=1e-5)
    assert h["entropy"][0] < math.log(h["tokens"]) - 0.05  # not uniform: the test sees real logits


def test_one_huge_patch_token_is_an_outlier_and_a_huge_class_token_is_not():
    m = _plain(depth=2)
    base = attention_health(m, _images())
    assert all(1.0 <= r < 3 for r in base["outlier_ratio"])
    with torch.no_grad():
        m.pos_embed[0, 1 + 5] += 500.0  # the 6th patch of every image
    h = attention_health(m, _images())
    assert all(r > 20 for r in h["outlier_ratio"])
    assert h["token_norm_max"][0] > 20 * h["token_norm_median"][0]
    m2 = _plain(depth=2)
    with torch.no_grad():
        m2.pos_embed[0, 0] += 500.0  # the class token: a prefix token, left out
    assert all(r < 3 for r in attention_health(m2, _images())["outlier_ratio"])


# -- the model, its modes and the random state are left as they were -------------------------------------


def test_health_leaves_modes_rng_hooks_and_grads_untouched():
    m = vitlab.create_model(
        "vit_ti16", img_size=16, patch_size=4, depth=2, num_classes=3, drop_rate=0.1, drop_path_rate=0.2
    )
    m.train()
    m.blocks[1].mlp.eval()  # a module frozen in eval keeps its own mode
    modes = {n: mod.training for n, mod in m.named_modules()}
    state = {k: v.clone() for k, v in m.state_dict().items()}
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    h = attention_health(m, _images())
    assert torch.equal(torch.get_rng_state(), rng)
    assert {n: mod.training for n, mod in m.named_modules()} == modes
    assert not hooks_anywhere(m)
    assert all(p.grad is None for p in m.parameters())
    assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
    # eval mode: the same numbers however often it runs (no dropout, no dropped paths)
    assert attention_health(m, _images()) == h


def test_accelerated_and_plain_models_give_the_same_health():
    fast = vitlab.create_model("vit_ti16", img_size=16, patch_size=4, depth=2, num_classes=3)
    plain = VisionTransformer(fast.config)
    plain.load_state_dict(fast.state_dict())
    assert type(fast) is not VisionTransformer
    a, b = attention_health(fast, _images()), attention_health(plain, _images())
    for key in ("entropy", "distance", "max_logit", "outlier_ratio"):
        assert a[key] == pytest.approx(b[key], rel=1e-5)


def test_hybrid_grid_comes_from_the_stem_and_axial_layers_are_measured():
    torch.manual_seed(0)
    kw = {"img_size": 64, "num_classes": 3, "depth": 2, "embed_dim": 64, "num_heads": 2, "mlp_dim": 64}
    h = attention_health(vitlab.create_model("vit_r_ti16", **kw), _images(2, 64))
    assert h["grid"] == [2, 2] and h["pixels_per_patch"] == 32.0 and h["tokens"] == 5
    assert h["uniform_distance"] == pytest.approx(_mean_grid_distance(2, 2, 32.0))
    kw["img_size"] = 32
    ax = attention_health(vitlab.create_model("axial_vit_b16", **kw), _images(2, 32))
    assert ax["layers"] == 2 and all(v is not None for v in ax["max_logit"])


def test_a_diverged_model_gives_nulls_not_nan():
    m = _plain(depth=2)
    with torch.no_grad():
        m.blocks[1].attn.qkv.weight[0, 0] = float("nan")
    h = attention_health(m, _images())
    json.dumps(h, allow_nan=False)
    assert h["max_logit"][0] is not None and h["max_logit"][1] is None and h["entropy"][1] is None
    assert h["collapsed_fraction"][1] == 0.0


def test_refuses_what_it_cannot_measure():
    m = _plain()
    with pytest.raises(InputError, match="image batch"):
        attention_health(m, torch.randn(3, 16, 16))
    with pytest.raises(InputError, match="image batch"):
        attention_health(m, torch.randn(0, 3, 16, 16))
    with pytest.raises(ConfigError, match="VisionTransformer"):
        attention_health(torch.nn.Linear(2, 2), _images())


# -- invariants on random small models ---------------------------------------------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    heads=st.sampled_from([1, 2, 4]),
    depth=st.integers(1, 2),
    patch=st.sampled_from([4, 8]),
    size=st.sampled_from([8, 16, 24]),
    pool=st.sampled_from(["cls", "gap"]),
    reg=st.integers(0, 2),
    sharpness=st.sampled_from([0.0, 1.0, 30.0]),
    qk_norm=st.booleans(),
)
def test_health_invariants(heads, depth, patch, size, pool, reg, sharpness, qk_norm):
    torch.manual_seed(0)
    m = VisionTransformer(
        img_size=size,
        patch_size=patch,
        embed_dim=8,
        depth=depth,
        num_heads=heads,
        mlp_dim=8,
        num_classes=2,
        pool=pool,
        class_token=pool == "cls",
        reg_tokens=reg,
        qk_norm=qk_norm,
    )
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(sharpness)
    h = attention_health(m, _images(2, size))
    json.dumps(h, allow_nan=False)
    t = h["tokens"]
    assert t == (size // patch) ** 2 + (pool == "cls") + reg
    assert len(h["entropy"]) == depth and all(len(r) == heads for r in h["entropy_per_head"])
    for row in h["entropy_per_head"]:
        assert all(0.0 <= e <= math.log(t) for e in row)
    assert all(0.0 <= f <= 1.0 for f in h["collapsed_fraction"])
    far = math.dist((0, 0), (size - patch, size - patch))
    assert all(0.0 <= d <= far + 1e-4 for row in h["distance_per_head"] for d in row)
    assert all(r >= 1.0 for r in h["outlier_ratio"])
    if sharpness == 0.0:
        assert all(abs(v) < 1e-6 for v in h["max_logit"])  # zero q, k weights and biases
