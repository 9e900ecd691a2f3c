"""The CPU inference path: oneDNN fused linears in ``FastBlock.forward`` (accel/onednn.py) and
the batch chunks of ``FastVisionTransformer.inference_chunk_size`` (accel/vit.py), each against
the plain classes of vitlab.models.

Every model here is tiny (32 px, patch 8, depth 2) except in the chunk-size formula tests,
which build the real configs on the meta device (no weights, no forward).
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from vitlab import accel
from vitlab.accel import INFERENCE_CHUNK_BYTES, onednn
from vitlab.accel import FastBlock as Block
from vitlab.accel import FastVisionTransformer as VisionTransformer
from vitlab.models import Block as PlainBlock
from vitlab.models import VisionTransformer as PlainViT
from vitlab.models import create_model as create_plain_model


def create_model(*args, **kwargs):
    return accel.accelerate(create_plain_model(*args, **kwargs))


needs_onednn = pytest.mark.skipif(not onednn.available(), reason="this torch build has no oneDNN fused linear ops")

TINY = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4, "mlp_dim": 128, "num_classes": 10}
LINEARS_PER_BLOCK = 4  # qkv, proj, fc1, fc2


def tiny_model(*, act: str = "gelu", seed: int = 0, **overrides) -> VisionTransformer:
    """A tiny ViT in eval mode with every parameter randomised: the zero-initialised head and
    biases would otherwise hide a missing bias or a wrong head input."""
    cfg = {**TINY, **overrides}
    model = VisionTransformer(**cfg, act="gelu" if act == "relu" else act)
    if act == "relu":  # make_act knows ReLU (and oneDNN fuses it) but ViTConfig only accepts the GELUs
        for blk in model.blocks:
            blk.mlp.act = nn.ReLU()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def images(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def assert_close_scaled(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> None:
    """Equal up to float32 rounding of a different summation order, relative to the output scale."""
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=0.0, atol=atol * scale)


def plain(fn, *args, **kwargs):
    """``fn`` (a model, or a model's method) run by a plain-class copy of its model."""
    model = getattr(fn, "__self__", fn)
    twin = copy.deepcopy(model)  # with any layer a test put in (e.g. a ReLU)
    for m in twin.modules():
        if type(m) is VisionTransformer:
            m.__class__ = PlainViT
        elif type(m) is Block:
            m.__class__ = PlainBlock
    return getattr(twin, fn.__name__)(*args, **kwargs) if fn is not model else twin(*args, **kwargs)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny GEMMs on a shared 2-core machine: OpenMP threads spinning against another
    process's made each forward ~50x slower. One thread; restored afterwards."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(autouse=True)
def _fresh_cache():
    onednn.clear_cache()
    yield
    onednn.clear_cache()


# -- oneDNN fused linears -------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(
    batch=st.integers(1, 4),
    act=st.sampled_from(["gelu", "gelu_tanh", "relu"]),
    qkv_bias=st.booleans(),
    pool=st.sampled_from(["cls", "gap"]),
    seed=st.integers(0, 2**16),
)
def test_fused_path_matches_the_plain_path(batch, act, qkv_bias, pool, seed):
    model = tiny_model(act=act, seed=seed, qkv_bias=qkv_bias, pool=pool)
    x = images(batch, seed)
    with torch.inference_mode():
        with mock.patch.object(onednn, "linear", wraps=onednn.linear) as spy:
            logits = model(x)
            feats = model.forward_features(x)
        want_logits = plain(model, x)
        want_feats = plain(model.forward_features, x)
    if onednn.available():  # the comparison is only worth something if the fused path ran
        # forward_features runs every block fused; with class-token pooling the logits' last block
        # runs for the class token alone (Block.forward_cls, plain linears on one row)
        logit_blocks = TINY["depth"] - (pool == "cls")
        assert spy.call_count == (TINY["depth"] + logit_blocks) * LINEARS_PER_BLOCK
    assert logits.shape == (batch, TINY["num_classes"])
    assert feats.shape == (batch, 1 + (32 // 8) ** 2, TINY["embed_dim"])
    assert_close_scaled(logits, want_logits)
    assert_close_scaled(feats, want_feats)


def test_fused_path_matches_under_no_grad_with_weights_packed_under_inference_mode():
    """The cache filled under inference_mode (inference tensors) serves a no_grad forward."""
    model, x = tiny_model(), images(3)
    with torch.inference_mode():
        first = model(x)
    with torch.no_grad():
        second = model(x)
        want = plain(model, x)
    assert_close_scaled(first, want)
    assert_close_scaled(second, want)


@needs_onednn
def test_applies_only_to_gradient_free_float32_cpu_eval():
    blk = Block(dim=64, num_heads=4, mlp_dim=128).eval()
    x = torch.randn(2, 17, 64)
    with torch.inference_mode():
        assert onednn.applies(blk, x)
    with torch.no_grad():
        assert onednn.applies(blk, x)
    # autograd on
    assert torch.is_grad_enabled()
    assert not onednn.applies(blk, x)
    # train mode (dropout, drop-path)
    blk.train()
    with torch.inference_mode():
        assert not onednn.applies(blk, x)
    blk.eval()
    with torch.inference_mode():
        # autocast: the fused op would run float32 where autocast promises bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not onednn.applies(blk, x)
        assert not onednn.applies(blk.double(), x.double())
        blk.float()
        with onednn.disabled():
            assert not onednn.applies(blk, x)
        assert onednn.applies(blk, x)  # disabled() restores the switch
        with pytest.raises(RuntimeError), onednn.disabled():
            raise RuntimeError("boom")
        assert onednn.applies(blk, x)  # ... also when the body raises


@pytest.fixture
def linear_forbidden(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("onednn.linear called outside gradient-free float32 CPU eval")

    monkeypatch.setattr(onednn, "linear", boom)


@pytest.mark.usefixtures("linear_forbidden")
def test_training_forward_stays_on_the_plain_path_and_gradients_flow():
    model = tiny_model().train()
    x = images(3)
    loss = model(x).logsumexp(dim=-1).mean()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    for blk in model.blocks:
        for lin in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2):
            assert lin.weight.grad.abs().sum() > 0
    # neither eval with autograd on, nor train mode without it, nor autocast nor float64
    model.eval()
    model(x).sum().backward()
    with torch.no_grad():
        model.train()(x)
        model.eval()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
        model.double()(x.double())


@needs_onednn
def test_eval_inference_forward_calls_onednn_linear():
    model, x = tiny_model(), images(2)
    model.cls_only_last_block = (
        False  # every block on every token (the shortcut is tested in test_cpu_training_path.py)
    )
    with mock.patch.object(onednn, "linear", wraps=onednn.linear) as spy, torch.inference_mode():
        model(x)
    assert spy.call_count == TINY["depth"] * LINEARS_PER_BLOCK
    acts = [c.kwargs.get("act") for c in spy.call_args_list]
    residuals = [c.kwargs.get("residual") is not None for c in spy.call_args_list]
    assert sum(a is not None for a in acts) == TINY["depth"]  # fc1 carries the GELU
    assert sum(residuals) == 2 * TINY["depth"]  # proj and fc2 carry the residual adds


@needs_onednn
def test_cache_follows_a_fused_adamw_step():
    """Fused AdamW writes the weights in place without bumping ``_version``: the sample
    comparison must notice, or the next inference runs on the old packed weights."""
    model, x = tiny_model(), images(3)
    with torch.inference_mode():
        before = model(x)  # packs the weights
    qkv = model.blocks[0].attn.qkv.weight
    ptr = qkv.data_ptr()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    model.train()
    model(x).logsumexp(dim=-1).mean().backward()
    opt.step()
    assert qkv.data_ptr() == ptr  # in place: same storage, so only the cache's checks can tell
    model.eval()
    with torch.inference_mode():
        after = model(x)
        want = plain(model, x)
    assert not torch.allclose(after, before, atol=1e-3)
    assert_close_scaled(after, want)


@needs_onednn
def test_cache_follows_load_state_dict():
    model, other, x = tiny_model(seed=0), tiny_model(seed=1), images(3)
    with torch.inference_mode():
        model(x)  # packs model's weights
        want = plain(other, x)
    model.load_state_dict(other.state_dict())
    with torch.inference_mode():
        got = model(x)
    assert_close_scaled(got, want)


@needs_onednn
def test_cache_follows_an_in_place_edit_of_unsampled_weights():
    """An in-place write through the parameter bumps its version counter: the cache must
    rebuild even though the sampled weights are unchanged."""
    model, x = tiny_model(), images(3)
    with torch.inference_mode():
        model(x)
    w = model.blocks[0].attn.qkv.weight
    assert w.numel() // onednn._SAMPLE > 1  # flat index 1 is not sampled
    with torch.no_grad():
        w.view(-1)[1] += 5.0
    with torch.inference_mode():
        got = model(x)
        want = plain(model, x)
    assert_close_scaled(got, want)


@needs_onednn
def test_clear_cache_drops_packed_weights():
    """An in-place edit that bumps no version counter (``.data`` has its own) and misses the
    sampled weights is only picked up after ``clear_cache()``."""
    model, x = tiny_model(), images(3)
    model.cls_only_last_block = False
    with torch.inference_mode():
        model(x)
    assert len(onednn._packed) == TINY["depth"] * LINEARS_PER_BLOCK
    w = model.blocks[0].attn.qkv.weight
    assert w.numel() // onednn._SAMPLE > 1  # flat index 1 is not sampled
    w.data.view(-1)[1] += 5.0
    onednn.clear_cache()
    assert len(onednn._packed) == 0
    with torch.inference_mode():
        got = model(x)
        want = plain(model, x)
    assert_close_scaled(got, want)
    assert len(onednn._packed) == TINY["depth"] * LINEARS_PER_BLOCK


def test_attention_maps_still_come_back_with_the_same_logits():
    model, x = tiny_model(), images(3)
    model.inference_chunk_bytes = 1  # attention capture must not be chunked either
    t = 1 + (32 // 8) ** 2
    with torch.inference_mode():
        with onednn.disabled():
            want = model(x)
        logits, attns = model(x, return_attention=True)
        with model.capture_attention() as captured:
            captured_logits = model(x)
    for maps in (attns, captured):
        assert len(maps) == TINY["depth"]
        for a in maps:
            assert a.shape == (3, TINY["num_heads"], t, t)
            torch.testing.assert_close(a.sum(-1), torch.ones(3, TINY["num_heads"], t))
    for a, b in zip(attns, captured, strict=True):
        torch.testing.assert_close(a, b)
    assert_close_scaled(logits, want)
    assert_close_scaled(captured_logits, want)


# -- inference batch chunks -----------------------------------------------------------------


def _meta_model(name: str, img_size: int = 224) -> VisionTransformer:
    with torch.device("meta"):  # the real config, without allocating or initialising weights
        model = create_model(name, img_size=img_size)
    return model.eval()


def _per_image_bytes(model: VisionTransformer, side: int) -> int:
    cfg = model.config
    tokens = model.num_prefix_tokens + (side // cfg.patch_size) ** 2
    return tokens * max(cfg.mlp_dim, 3 * cfg.embed_dim) * 4


@pytest.mark.parametrize(
    ("name", "img_size", "batch", "chunk"),
    [("vit_s16", 224, 32, 16), ("vit_b16", 224, 16, 8), ("vit_l16", 224, 16, 6), ("vit_s16", 384, 32, 7)],
)
def test_chunk_size_on_the_real_configs(name, img_size, batch, chunk):
    model = _meta_model(name, img_size)
    assert model.inference_chunk_bytes == INFERENCE_CHUNK_BYTES == 24 * 2**20
    x = torch.empty(batch, 3, img_size, img_size)
    with torch.inference_mode():
        assert model.inference_chunk_size(x) == chunk
        assert model.inference_chunk_size(x[:1]) == 1
    with torch.no_grad():
        assert model.inference_chunk_size(x) == chunk
    assert model.inference_chunk_size(x) == batch  # autograd on: training runs the whole batch
    with torch.inference_mode():
        assert model.inference_chunk_size(torch.empty(batch, 3, img_size, img_size, device="meta")) == batch  # CPU only
        model.inference_chunk_bytes = None
        assert model.inference_chunk_size(x) == batch


def test_chunks_stay_under_the_byte_limit():
    for name, side in (("vit_s16", 224), ("vit_b16", 224), ("vit_l16", 224), ("vit_s16", 384), ("vit_l16", 512)):
        model = _meta_model(name, side)
        per_image = _per_image_bytes(model, side)
        with torch.inference_mode():
            for batch in range(1, 65):
                n = model.inference_chunk_size(torch.empty(batch, 3, side, side))
                assert n == batch or n * per_image <= model.inference_chunk_bytes, (name, side, batch, n)


def _block_batches(model: VisionTransformer) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """Record the batch size each forward of the first block sees (not with a hook: a hook anywhere
    in the model turns the chunks off)."""
    seen: list[int] = []
    first = model.blocks[0]
    forward = Block.forward

    def spy(self, x, **kw):
        if self is first:
            seen.append(x.shape[0])
        return forward(self, x, **kw)

    patch = mock.patch.object(Block, "forward", spy)
    patch.start()
    return seen, mock.Mock(remove=patch.stop)


def test_chunked_forward_equals_the_whole_batch():
    model, x = tiny_model(), images(7)
    per_image = _per_image_bytes(model, 32)
    with torch.inference_mode():
        model.inference_chunk_bytes = None
        want_logits, want_feats = model(x), model.forward_features(x)
        model.inference_chunk_bytes = 3 * per_image
        assert model.inference_chunk_size(x) == 3
        seen, handle = _block_batches(model)
        try:
            logits = model(x)
            assert seen == [3, 3, 1]
            seen.clear()
            feats = model.forward_features(x)
            assert seen == [3, 3, 1]
        finally:
            handle.remove()
    # every image is computed on its own; the class-token-only last block's small GEMMs (a few rows)
    # may round differently with the number of rows, by float32 rounding only
    assert_close_scaled(logits, want_logits, atol=5e-6)
    torch.testing.assert_close(feats, want_feats, rtol=0.0, atol=1e-6)


def test_training_forward_is_not_chunked():
    model, x = tiny_model(), images(7)
    model.inference_chunk_bytes = 1
    seen, handle = _block_batches(model)
    try:
        model(x).sum().backward()
        model.train()(x)
    finally:
        handle.remove()
    assert seen == [7, 7]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::FutureWarning")
def test_trace_does_not_bake_in_the_chunks():
    model = tiny_model()
    model.inference_chunk_bytes = 1  # one image per chunk in eager mode
    x4, x3 = images(4), images(3, seed=2)
    with torch.no_grad():
        assert model.inference_chunk_size(x4) == 1
        traced = torch.jit.trace(model, x4)
        graph = str(traced.inlined_graph)
        assert "mkldnn" not in graph  # tracing takes the plain aten path too
        for x in (x3, x4, images(5, seed=3)):
            torch.testing.assert_close(traced(x), model(x), rtol=0.0, atol=1e-5)


def test_entering_training_mode_drops_the_packed_weights():
    if not onednn.available():
        pytest.skip("no oneDNN in this torch build")
    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=10
    ).eval()
    fc1 = model.blocks[0].mlp.fc1
    with torch.inference_mode():
        model(torch.randn(2, 3, 32, 32))
    assert fc1 in onednn._packed
    model.eval()  # eval keeps them
    assert fc1 in onednn._packed
    model.train()
    assert not any(m in onednn._packed for m in model.modules())


def test_a_model_built_under_inference_mode_runs_the_fused_path():
    """Its parameters are inference tensors, which have no version counter to key the cache on."""
    with torch.inference_mode():
        model = VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_dim=128, num_classes=10
        ).eval()
        assert model.blocks[0].mlp.fc1.weight.is_inference()
        x = torch.randn(3, 3, 32, 32)
        got = model.forward_features(x)
        with onednn.disabled():
            want = model.forward_features(x)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        before = got
        with torch.no_grad():
            model.blocks[0].mlp.fc1.weight.mul_(3.0)  # in place, inside inference mode
        got = model.forward_features(x)
        with onednn.disabled():
            want = model.forward_features(x)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        assert not torch.allclose(got, before)
