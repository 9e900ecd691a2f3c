"""Packed input (models/packed.py, NaViT's "Patch n' Pack"): several images of any shapes in sequences with
block-diagonal attention give each image the logits of the unpacked model on it alone (cls / gap / map pooling,
1-D learned, factorised 2-D learned and sine-cosine position embeddings, registers, the distillation token);
the unpacked path is the code it was; token dropping before packing composes; accel/ runs the images of each length
as a batch, or stands aside when the blocks draw random numbers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_close_rel
from vitlab import accel
from vitlab.errors import ConfigError, InputError
from vitlab.models import VisionTransformer
from vitlab.models.layers import Attention
from vitlab.models.packed import ATTENTION_METHODS, PackedAttention, PackedPatches, drop_tokens, pack, patchify

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)
ARCHS = {
    "cls-learn": dict(),
    "cls-learn-registers": dict(reg_tokens=2),
    "gap-learn2d": dict(pool="gap", class_token=False, posemb="learn2d"),
    "gap-sincos2d-registers": dict(pool="gap", class_token=False, posemb="sincos2d", reg_tokens=1),
    "gap-fcnorm-learn": dict(pool="gap", fc_norm=True),
    "cls-learn2d-qknorm-layerscale": dict(posemb="learn2d", qk_norm=True, init_values=0.5),
    "cls-sincos2d": dict(posemb="sincos2d"),
    "map-learn": dict(pool="map", reg_tokens=1),
    "distilled": dict(dist_token=True),
    "gap-nopos": dict(pool="gap", class_token=False, posemb="none"),
}


def randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its initial value (zero head, zero biases would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def image(h: int, w: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(3, h, w, generator=torch.Generator().manual_seed(seed))


def unpacked(model: torch.nn.Module, images: list[torch.Tensor]) -> torch.Tensor:
    """Each image through the usual path, alone."""
    return torch.cat([model(x[None]) for x in images])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _attention_before_packing(self, x, *, return_attention=False, rope=None):
    """Attention.forward as it was before the attention mask existed (the reference for bit-identity)."""
    b, n, d = x.shape
    q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = self.q_norm(q), self.k_norm(k)
    if rope is not None:
        q, k = self.rope(q, rope), self.rope(k, rope)
    drop = self.attn_drop if self.training else 0.0
    if return_attention:
        weights = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        out = F.dropout(weights, p=drop, training=self.training) @ v
    else:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
    out = self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, d)))
    return (out, weights) if return_attention else out


@pytest.mark.parametrize("arch", [dict(), dict(pool="gap", class_token=False, reg_tokens=2), dict(rope=True)])
def test_the_unpacked_path_is_bit_identical(arch, monkeypatch):
    model = randomised(VisionTransformer(**TINY, **arch))
    x = torch.randn(3, 3, 32, 48)
    with torch.no_grad():
        now = model(x)
        now_attn = model(x, return_attention=True)[1]
        monkeypatch.setattr(Attention, "forward", _attention_before_packing)
        before = model(x)
        before_attn = model(x, return_attention=True)[1]
    assert torch.equal(now, before)
    assert all(torch.equal(a, b) for a, b in zip(now_attn, before_attn, strict=True))


@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS.keys())
@pytest.mark.parametrize("shape", [(32, 32), (24, 40)], ids=["square", "wide"])
def test_one_image_packed_is_the_unpacked_model(arch, shape):
    """One image (padding after it) gives the logits and pooled features of the usual path at its size (the 1-D
    learned table resampled to a non-square grid in both)."""
    model = randomised(VisionTransformer(**TINY, **arch))
    x = image(*shape)
    packed = pack([[patchify(x, 8)]], seq_len=40, prefix_tokens=model.num_prefix_tokens)
    with torch.no_grad():
        assert_close_rel(model(packed), model(x[None]))
        assert_close_rel(
            model.forward_packed(packed, pre_logits=True),
            model.forward_head(model.forward_features(x[None]), pre_logits=True),
        )


@pytest.mark.parametrize("method", ATTENTION_METHODS)
@pytest.mark.parametrize("arch", ARCHS.values(), ids=ARCHS.keys())
def test_several_images_packed_give_each_its_own_output(arch, method):
    model = randomised(VisionTransformer(**TINY, **arch))
    model.packed_attention = method
    shapes = [(32, 32), (16, 40), (48, 24), (8, 8), (8, 64), (24, 16)]
    xs = [image(h, w, seed=i) for i, (h, w) in enumerate(shapes)]
    tok = [patchify(x, 8) for x in xs]
    seqs = [[tok[0], tok[1]], [tok[2], tok[3], tok[4]], [], [tok[5]]]  # (an empty one: an epoch's last batch)
    packed = pack(seqs, seq_len=60, prefix_tokens=model.num_prefix_tokens)
    assert packed.padding_fraction() > 0
    with torch.no_grad():
        assert_close_rel(model(packed), unpacked(model, xs))


@settings(max_examples=15, deadline=None)
@given(
    grids=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=6),
    per_seq=st.integers(1, 3),
    spare=st.integers(0, 7),
    arch=st.sampled_from(sorted(ARCHS)),
    method=st.sampled_from(ATTENTION_METHODS),
)
def test_any_grids_in_any_sequences(grids, per_seq, spare, arch, method):
    """Hypothesis: images of any grids (1 x 1 to 6 x 6 patches), ``per_seq`` to a sequence, any padding, either
    attention method."""
    model = randomised(VisionTransformer(**TINY, **ARCHS[arch]))
    model.packed_attention = method
    p = model.num_prefix_tokens
    xs = [image(8 * h, 8 * w, seed=i) for i, (h, w) in enumerate(grids)]
    tok = [patchify(x, 8) for x in xs]
    seqs = [tok[i : i + per_seq] for i in range(0, len(tok), per_seq)]
    seq_len = max(sum(t.patches.shape[0] + p for t in s) for s in seqs) + spare
    with torch.no_grad():
        assert_close_rel(model(pack(seqs, seq_len=seq_len, prefix_tokens=p)), unpacked(model, xs))


@pytest.mark.parametrize("arch", [dict(), dict(pool="gap", class_token=False, posemb="learn2d", reg_tokens=1)])
def test_token_dropping_before_packing_is_patch_dropout(arch):
    """Tokens dropped from an image before packing (kept with their rows and columns) give what the unpacked model
    gives when PatchDropout keeps the same patches: the position embeddings travel with the tokens."""
    model = randomised(VisionTransformer(**TINY, **arch))
    x = image(24, 40)
    kept = drop_tokens(patchify(x, 8), 0.5, generator=torch.Generator().manual_seed(3))
    assert kept.patches.shape[0] == 7  # int(15 * 0.5)
    idx = kept.rows * 5 + kept.cols
    p = model.num_prefix_tokens
    with torch.no_grad():
        z = model.embed(x[None])
        z = torch.cat([z[:, :p], z[:, p:][:, idx]], dim=1)  # what PatchDropout's gather keeps
        want = model.forward_head(model.encode(z, model.grid(x[None]))["encoded"])
        got = model(pack([[kept]], seq_len=12, prefix_tokens=p))
    assert_close_rel(got, want)


@pytest.mark.parametrize("method", ATTENTION_METHODS)
def test_gradients_are_those_of_the_images_apart(method):
    """Training: attention stays within each image in the backward pass too (dropout off: deterministic)."""
    model = randomised(VisionTransformer(**TINY, reg_tokens=1)).train()
    model.packed_attention = method
    twin = copy.deepcopy(model)
    xs = [image(16, 40, seed=1), image(32, 24, seed=2), image(8, 16, seed=3)]
    packed = pack([[patchify(x, 8) for x in xs[:2]], [patchify(xs[2], 8)]], seq_len=30, prefix_tokens=2)
    model(packed).square().sum().backward()
    unpacked(twin, xs).square().sum().backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert_close_rel(a.grad, b.grad, rtol=1e-4, msg=name)


def test_images_of_one_length_attend_in_one_call_each_within_itself():
    """``split`` gathers the images of one token count across sequences into one attention call: the logits and
    gradients stay those of each image alone, with padding between and after the runs."""
    model = randomised(VisionTransformer(**TINY, reg_tokens=1)).train()
    twin = copy.deepcopy(model)
    xs = [image(16, 16, seed=s) for s in (1, 2, 3)] + [image(8, 32, seed=4), image(24, 8, seed=5)]
    tokens = [patchify(x, 8) for x in xs]  # 4, 4, 4, 4 and 3 patches: four images of one length
    packed = pack([[tokens[0], tokens[3]], [tokens[1]], [tokens[4], tokens[2]]], seq_len=14, prefix_tokens=2)
    attention = PackedAttention(packed.image_ids)
    assert sorted(len(g) for g in attention.same_length) == [1, 4] and bool((packed.image_ids < 0).any())
    order, sizes, shapes, back = attention.gather  # one batch of four 6-token images, one of a 5-token image
    assert sorted(shapes) == [(1, 5), (4, 6)] and sizes == [n * length for n, length in shapes]
    assert int((back == order.numel()).sum()) == int((packed.image_ids < 0).sum())  # padding: the zero row
    order = [0, 3, 1, 4, 2]  # the images in packed order
    got = model(packed)
    want = unpacked(twin, [xs[i] for i in order])
    assert_close_rel(got, want)
    got.square().sum().backward()
    want.square().sum().backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert_close_rel(a.grad, b.grad, rtol=1e-4, msg=name)


def test_gradient_checkpointing_gives_the_same_packed_output():
    model = randomised(VisionTransformer(**TINY)).train()
    packed = pack([[patchify(image(16, 24), 8), patchify(image(24, 8), 8)]], seq_len=16, prefix_tokens=1)
    want = model(packed)
    model.set_grad_checkpointing(True)
    assert_close_rel(model(packed), want)


def test_attention_is_block_diagonal():
    model = randomised(VisionTransformer(**TINY))
    packed = pack([[patchify(image(16, 16), 8), patchify(image(8, 24), 8)]], seq_len=12, prefix_tokens=1)
    with torch.no_grad(), model.capture_attention() as captured:
        _, attns = model(packed, return_attention=True)
    mask = PackedAttention(packed.image_ids).mask()
    assert len(attns) == 2 and len(captured) == 2
    for a in attns:
        assert a.shape == (1, 2, 12, 12)
        assert torch.all(a.masked_select(~mask) == 0)
        assert_close_rel(a.sum(-1), torch.ones(1, 2, 12))


def test_features_of_packed_input_are_per_token():
    model = randomised(VisionTransformer(**TINY))
    x = image(16, 24)
    packed = pack([[patchify(x, 8)]], seq_len=9, prefix_tokens=1)
    with torch.no_grad():
        feats = model.forward_features(packed)
        assert_close_rel(feats[:, :7], model.forward_features(x[None]))


def _speed_path_calls(monkeypatch) -> list[str]:
    """The fused training and inference block paths each call appends its name to (and then runs)."""
    from vitlab.accel import fused_block, onednn

    calls: list[str] = []
    for mod in (fused_block, onednn):
        real = mod.block_forward
        monkeypatch.setattr(
            mod, "block_forward", lambda *a, _r=real, _n=mod.__name__, **k: calls.append(_n) or _r(*a, **k)
        )
    return calls


@pytest.mark.parametrize("arch", ["cls-learn", "gap-sincos2d-registers", "distilled"])
@pytest.mark.parametrize("train", [False, True])
def test_accel_runs_the_packed_images_of_each_length_as_a_batch(arch, train, monkeypatch):
    """The speed paths run packed input by lengths (the images of one length as a batch through every block): the
    logits, the pooled features and every parameter's gradient are the plain packed model's, to float32 rounding;
    the fused blocks ran, and under class-token pooling the last block for the class tokens alone."""
    plain = randomised(VisionTransformer(**TINY, **ARCHS[arch])).train(train)
    fast = accel.accelerate(copy.deepcopy(plain))
    xs = [image(16, 40), image(32, 32, seed=2), image(40, 16, seed=3), image(24, 24, seed=4), image(8, 16, seed=5)]
    packed = pack(
        [[patchify(x, 8) for x in xs[:3]], [patchify(x, 8) for x in xs[3:]]],
        seq_len=48,
        prefix_tokens=fast.num_prefix_tokens,
    )
    assert fast.packed_accelerable()
    cls_only = fast.cls_only_applies()  # class-token pooling: the last block for the class tokens alone
    assert cls_only == (arch == "cls-learn")
    calls = _speed_path_calls(monkeypatch)
    real_cls = accel.FastBlock.forward_cls
    monkeypatch.setattr(accel.FastBlock, "forward_cls", lambda *a: calls.append("cls") or real_cls(*a))
    with torch.set_grad_enabled(train):
        got, want = fast(packed), plain(packed)
        assert_close_rel(fast.forward_packed(packed, pre_logits=True), plain.forward_packed(packed, pre_logits=True))
    assert_close_rel(got, want)
    blocks = [c for c in calls if c != "cls"]  # four lengths (10, 16, 9 and 2 patches), a call each, twice
    assert calls.count("cls") == 2 * 4 * cls_only
    assert len(blocks) == 2 * 4 * (len(fast.blocks) - cls_only) or (not blocks and not train)
    if train:
        assert blocks == ["vitlab.accel.fused_block"] * len(blocks)
        (got * torch.arange(got.numel()).view_as(got)).sum().backward()
        (want * torch.arange(want.numel()).view_as(want)).sum().backward()
        grads = dict(plain.named_parameters())
        for name, p in fast.named_parameters():
            assert_close_rel(p.grad, grads[name].grad, msg=name)


@pytest.mark.parametrize("option", ["drop_path_rate", "attn_drop_rate", "drop_rate"])
def test_accel_stands_aside_for_packed_input_that_draws_in_its_blocks(option, monkeypatch):
    """Stochastic depth and dropout draw per packed sequence on the plain path: a training forward with either
    takes the plain packed forward (the same draws, the same numbers)."""
    plain = randomised(VisionTransformer(**TINY, **{option: 0.3})).train()
    fast = accel.accelerate(copy.deepcopy(plain))
    packed = pack([[patchify(image(16, 40), 8), patchify(image(32, 32, seed=2), 8)]], seq_len=30, prefix_tokens=1)
    assert not fast.packed_accelerable() and not fast.accelerable(packed)
    calls = _speed_path_calls(monkeypatch)
    torch.manual_seed(0)
    got = fast(packed)
    torch.manual_seed(0)
    assert torch.equal(got, plain(packed)) and calls == []
    assert fast.eval().packed_accelerable()


def test_refused_options():
    packed = pack([[patchify(image(16, 16), 8)]], seq_len=5, prefix_tokens=1)
    for arch, what in (
        (dict(attention="axial"), "axial"),
        (dict(rope=True, posemb="none"), "RoPE"),
        (dict(hybrid_layers=(), img_size=64, patch_size=1), "hybrid"),
    ):
        with pytest.raises(ConfigError, match=what):
            VisionTransformer(**{**TINY, **arch})(packed)
    model = VisionTransformer(**TINY, patch_drop_rate=0.5)
    model.eval()(packed)  # evaluation keeps every token anyway
    with pytest.raises(ConfigError, match="before packing"):
        model.train()(packed)
    with pytest.raises(ConfigError, match="token merging"):
        VisionTransformer(**TINY).set_tome(1)(packed)
    model = VisionTransformer(**TINY)
    model.packed_attention = "flash"
    with pytest.raises(ConfigError, match="'flash' is unknown"):
        model(packed)


def test_malformed_layouts_are_one_line_errors():
    model = VisionTransformer(**TINY).eval()
    good = pack([[patchify(image(16, 16), 8), patchify(image(8, 16), 8)]], seq_len=10, prefix_tokens=1)
    model(good)
    ids = good.image_ids.clone()
    ids[0, [2, 5]] = ids[0, [5, 2]]  # image 0's tokens no longer contiguous
    rows = good.rows.clone()
    rows[0, 1] = 9  # outside its grid
    bad = {
        "prefix slots": PackedPatches(**{**vars(good), "prefix_tokens": 0}),
        "C x P x P": PackedPatches(**{**vars(good), "patches": good.patches[..., :-1]}),
        "contiguous": PackedPatches(**{**vars(good), "image_ids": ids}),
        "inside the image's grid": PackedPatches(**{**vars(good), "rows": rows}),
        "image ids": PackedPatches(**{**vars(good), "grids": good.grids[:1]}),
    }
    for what, packed in bad.items():
        with pytest.raises(InputError, match=what):
            model(packed)
    with pytest.raises(InputError, match="more than its 7 tokens"):
        pack([[patchify(image(16, 16), 8), patchify(image(8, 16), 8)]], seq_len=7, prefix_tokens=1)
